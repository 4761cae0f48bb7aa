// tests/sdk/sdk_test.mjs - the official OpenAI Node SDK (npm `openai`, pinned in package.json /
// package-lock.json) as a real client of a running Tandem router: every case is a named async
// function in CASES, run in order; each prints "ok NAME (ms)" or "FAIL NAME: why", and the
// script exits 1 when any failed. tests/sdk/run starts the local cluster and calls it:
//
//   node tests/sdk/sdk_test.mjs --base-url http://127.0.0.1:PORT/v1 --model NAME [--only a,b]
//
// Every comparison that needs the same tokens twice sends its own X-Session-Id: a request
// without one may continue another session that shares its prefix (docs/PROTOCOL.md), which is
// a different computation. The random-weight test model writes gibberish; the cases check the
// protocol (shapes, counts, indices, reproducibility), never the words.
//
import assert from 'node:assert/strict';
import OpenAI from 'openai';

function parseArgs(argv) {
    const args = { baseURL: null, model: null, only: null };
    for (let i = 2; i < argv.length; i++) {
        if (argv[i] === '--base-url') args.baseURL = argv[++i];
        else if (argv[i] === '--model') args.model = argv[++i];
        else if (argv[i] === '--only') args.only = argv[++i].split(',');
        else throw new Error(`unknown argument ${argv[i]}`);
    }
    if (!args.baseURL || !args.model) {
        throw new Error('usage: sdk_test.mjs --base-url URL --model NAME [--only a,b]');
    }
    return args;
}

const args = parseArgs(process.argv);
const MODEL = args.model;
const client = new OpenAI({
    baseURL: args.baseURL,
    apiKey: 'tandem-test', // the router asks for none; the SDK insists on one
    maxRetries: 0,
    timeout: 120_000,
});
const RUN = `${process.pid}-${Date.now()}`;
let sessionCounter = 0;

// Request options that put a request in a fresh session of its own (or in `name`).
function session(name) {
    return { headers: { 'X-Session-Id': name ?? `sdk-${RUN}-${sessionCounter++}` } };
}

const CHAT = [{ role: 'user', content: 'Write a function that reverses a linked list.' }];

async function collectChat(stream) {
    const out = { texts: [], finish: [], usage: null, ids: new Set(), chunks: 0 };
    for await (const chunk of stream) {
        out.chunks++;
        out.ids.add(chunk.id);
        if (chunk.usage) {
            out.usage = chunk.usage;
            assert.equal(chunk.choices.length, 0, 'the usage chunk has no choices');
        }
        for (const c of chunk.choices) {
            out.texts[c.index] = (out.texts[c.index] ?? '') + (c.delta?.content ?? '');
            if (c.finish_reason) {
                assert.equal(out.finish[c.index], undefined, `choice ${c.index} finished twice`);
                out.finish[c.index] = c.finish_reason;
            }
        }
    }
    return out;
}

async function models_list_and_retrieve() {
    const ids = [];
    for await (const m of client.models.list()) {
        ids.push(m.id);
        assert.equal(m.object, 'model');
    }
    assert.deepEqual(ids, [MODEL]);
    const m = await client.models.retrieve(MODEL);
    assert.equal(m.id, MODEL);
    assert.equal(m.object, 'model');
    assert.equal(typeof m.owned_by, 'string');
    await assert.rejects(client.models.retrieve('no-such-model'), (e) => {
        assert.ok(e instanceof OpenAI.NotFoundError, `expected NotFoundError, got ${e}`);
        assert.equal(e.status, 404);
        assert.equal(e.code, 'model_not_found');
        return true;
    });
}

async function chat_whole_and_streamed() {
    const whole = await client.chat.completions.create(
        { model: MODEL, messages: CHAT, max_tokens: 12, temperature: 0 }, session());
    assert.equal(whole.object, 'chat.completion');
    assert.equal(whole.model, MODEL);
    assert.equal(whole.choices.length, 1);
    const choice = whole.choices[0];
    assert.equal(choice.index, 0);
    assert.equal(choice.message.role, 'assistant');
    assert.equal(typeof choice.message.content, 'string');
    assert.ok(['stop', 'length'].includes(choice.finish_reason));
    assert.ok(whole.usage.prompt_tokens > 0);
    assert.ok(whole.usage.completion_tokens > 0 && whole.usage.completion_tokens <= 12);
    assert.equal(whole.usage.total_tokens,
                 whole.usage.prompt_tokens + whole.usage.completion_tokens);

    const stream = await client.chat.completions.create(
        { model: MODEL, messages: CHAT, max_tokens: 12, temperature: 0, stream: true,
          stream_options: { include_usage: true } }, session());
    const got = await collectChat(stream);
    assert.equal(got.ids.size, 1, 'every chunk has the same id');
    assert.equal(got.texts[0], choice.message.content);
    assert.equal(got.finish[0], choice.finish_reason);
    assert.ok(got.usage, 'include_usage: a final usage chunk');
    assert.equal(got.usage.completion_tokens, whole.usage.completion_tokens);
    assert.equal(got.usage.prompt_tokens, whole.usage.prompt_tokens);
}

async function completions_whole_and_streamed() {
    const prompt = 'def fibonacci(n):';
    const whole = await client.completions.create(
        { model: MODEL, prompt, max_tokens: 10, temperature: 0 }, session());
    assert.equal(whole.object, 'text_completion');
    assert.equal(whole.choices.length, 1);
    assert.equal(typeof whole.choices[0].text, 'string');
    assert.ok(whole.usage.completion_tokens > 0);

    const stream = await client.completions.create(
        { model: MODEL, prompt, max_tokens: 10, temperature: 0, stream: true,
          stream_options: { include_usage: true } }, session());
    let text = '';
    let finish = null;
    let usage = null;
    for await (const chunk of stream) {
        if (chunk.usage) usage = chunk.usage;
        for (const c of chunk.choices) {
            assert.equal(c.index, 0);
            text += c.text;
            if (c.finish_reason) finish = c.finish_reason;
        }
    }
    assert.equal(text, whole.choices[0].text);
    assert.equal(finish, whole.choices[0].finish_reason);
    assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
}

async function include_usage_cached_tokens_on_second_turn() {
    const name = `sdk-${RUN}-turns`;
    const first = await client.chat.completions.create(
        { model: MODEL, messages: CHAT, max_tokens: 8, temperature: 0 }, session(name));
    assert.equal(first.usage.prompt_tokens_details?.cached_tokens, 0, 'a new session reuses none');
    const turn2 = [...CHAT, { role: 'assistant', content: first.choices[0].message.content },
                   { role: 'user', content: 'Now make it iterative.' }];
    const stream = await client.chat.completions.create(
        { model: MODEL, messages: turn2, max_tokens: 8, temperature: 0, stream: true,
          stream_options: { include_usage: true } }, session(name));
    const got = await collectChat(stream);
    const cached = got.usage?.prompt_tokens_details?.cached_tokens;
    assert.ok(cached > 0, `turn 2 reuses the session's prefix (cached_tokens ${cached})`);
    assert.ok(cached < got.usage.prompt_tokens);
    assert.ok(cached >= first.usage.prompt_tokens - 1,
              `at least turn 1's prompt is reused (${cached} of ${first.usage.prompt_tokens})`);
}

async function n3_whole_and_streamed_reproducible() {
    const req = { model: MODEL, messages: CHAT, max_tokens: 8, temperature: 1, seed: 1234, n: 3 };
    const a = await client.chat.completions.create(req, session());
    const b = await client.chat.completions.create(req, session());
    assert.equal(a.choices.length, 3);
    a.choices.forEach((c, i) => assert.equal(c.index, i));
    assert.deepEqual(b.choices.map((c) => c.message.content),
                     a.choices.map((c) => c.message.content), 'same seed, same set');
    const texts = a.choices.map((c) => c.message.content);
    assert.ok(new Set(texts).size > 1, 'the choices sample their own streams');
    assert.ok(a.usage.completion_tokens > 0);

    const stream = await client.chat.completions.create(
        { ...req, stream: true, stream_options: { include_usage: true } }, session());
    const got = await collectChat(stream);
    assert.deepEqual(got.texts, texts, 'streamed choices equal the whole ones');
    assert.equal(got.finish.length, 3);
    got.finish.forEach((f, i) => assert.equal(f, a.choices[i].finish_reason));
    assert.equal(got.usage.completion_tokens, a.usage.completion_tokens, 'usage sums the choices');

    const one = await client.chat.completions.create({ ...req, n: 1 }, session());
    assert.equal(one.choices[0].message.content, texts[0], 'choice 0 is the n = 1 answer');
}

async function abort_mid_stream_then_normal_request() {
    // The same session for both requests: a turn the router did not release after the client
    // left would keep the session busy (409 session_busy) for the next one.
    const name = `sdk-${RUN}-abort`;
    const stream = await client.chat.completions.create(
        // min_tokens: random weights may sample EOS early; the abort must come first
        { model: MODEL, messages: CHAT, max_tokens: 200, min_tokens: 200, temperature: 0.8,
          stream: true }, session(name));
    let chunks = 0;
    let finished = false;
    for await (const chunk of stream) {
        for (const c of chunk.choices) {
            if (c.finish_reason) finished = true;
        }
        if (chunk.choices.length > 0 && ++chunks === 3) {
            stream.controller.abort(); // chunks already buffered by the SDK are not read
            break;
        }
    }
    assert.equal(chunks, 3);
    assert.ok(!finished, 'aborted before the end of its 200 tokens');
    assert.ok(stream.controller.signal.aborted);
    // The router notices the closed connection at its next write: allow it a moment.
    let after = null;
    for (let tries = 0; after === null; tries++) {
        try {
            after = await client.chat.completions.create(
                { model: MODEL, messages: CHAT, max_tokens: 6, temperature: 0 }, session(name));
        } catch (e) {
            if (e?.status !== 409 || tries >= 30) throw e;
            await new Promise((r) => setTimeout(r, 100));
        }
    }
    assert.equal(after.choices.length, 1);
    assert.ok(after.usage.completion_tokens > 0);
}

// The Responses API: whole, then streamed and whole turns chained by previous_response_id
// without a session header (the stored response carries its session, so the chained turn
// reuses the first turn's KV), typed events adding up to the final response, and the refusal
// of an unknown previous_response_id.
async function responses_whole_streamed_chained() {
    const first = await client.responses.create(
        { model: MODEL, instructions: 'Answer briefly.', input: CHAT[0].content,
          max_output_tokens: 8, temperature: 0 }, session());
    assert.equal(first.object, 'response');
    assert.match(first.id, /^resp_/);
    assert.ok(['completed', 'incomplete'].includes(first.status), first.status);
    assert.equal(first.output[0].type, 'message');
    assert.equal(first.output_text, first.output[0].content[0].text);
    assert.ok(first.usage.input_tokens > 0);
    assert.ok(first.usage.output_tokens > 0 && first.usage.output_tokens <= 8);
    assert.equal(first.usage.input_tokens_details.cached_tokens, 0, 'a new session reuses none');

    // instructions are not carried over by previous_response_id (the API's rule): an agent
    // sends them every turn, so the prompt keeps turn 1's prefix
    const next = { model: MODEL, instructions: 'Answer briefly.', previous_response_id: first.id,
                   input: 'Now make it iterative.', max_output_tokens: 8, temperature: 0 };
    const stream = await client.responses.create({ ...next, stream: true });
    const types = [];
    let text = '';
    let final = null;
    let seq = -1;
    for await (const ev of stream) {
        types.push(ev.type);
        assert.equal(ev.sequence_number, seq + 1, 'sequence numbers count up');
        seq = ev.sequence_number;
        if (ev.type === 'response.output_text.delta') text += ev.delta;
        if (ev.type === 'response.completed' || ev.type === 'response.incomplete') {
            final = ev.response;
        }
    }
    assert.equal(types[0], 'response.created');
    assert.equal(types[1], 'response.in_progress');
    assert.ok(final, `a final event (got ${types.join(',')})`);
    assert.equal(final.previous_response_id, first.id);
    assert.equal(final.output[0].content[0].text, text, 'the deltas add up to the output');
    const cached = final.usage.input_tokens_details.cached_tokens;
    assert.ok(cached >= first.usage.input_tokens - 1,
              `the chained turn reuses turn 1's KV (cached ${cached} of ${final.usage.input_tokens})`);

    // The same two turns whole, from a twin of turn 1 in a session of its own (the same
    // computation: chaining twice from one response would continue a session that moved on).
    const twin = await client.responses.create(
        { model: MODEL, instructions: 'Answer briefly.', input: CHAT[0].content,
          max_output_tokens: 8, temperature: 0 }, session());
    assert.equal(twin.output_text, first.output_text);
    const whole = await client.responses.create({ ...next, previous_response_id: twin.id });
    assert.equal(whole.output_text, text, 'whole and streamed chained turns agree');

    await assert.rejects(
        client.responses.create({ ...next, previous_response_id: 'resp_unknown' }),
        (e) => e.status === 400 && e.param === 'previous_response_id');
}

// ---- tools, structured output, reasoning (the constraint makes random weights answer in form) --

const TOOLS = [
    { type: 'function', function: {
        name: 'read_file', description: 'Read lines of a file of the repository.',
        parameters: { type: 'object', additionalProperties: false, required: ['path', 'max_lines'],
                      // enums bound what random weights write inside the forced call
                      properties: { path: { type: 'string', enum: ['README.md', 'src/main.c'] },
                                    max_lines: { type: 'integer', enum: [10, 100] } } } } },
    { type: 'function', function: {
        name: 'run_tests', description: 'Run the test suite.',
        parameters: { type: 'object', additionalProperties: false, required: ['verbose'],
                      properties: { verbose: { type: 'boolean' } } } } },
];

// A call that names one of `tools` and whose arguments parse and satisfy its schema.
function checkCall(call, tools = TOOLS) {
    assert.equal(call.type, 'function');
    assert.match(call.id, /^call_/);
    const tool = tools.find((t) => t.function.name === call.function.name);
    assert.ok(tool, `a call of a known tool (${call.function.name})`);
    const args = JSON.parse(call.function.arguments);
    const schema = tool.function.parameters;
    assert.deepEqual(Object.keys(args).sort(), [...schema.required].sort(), 'required keys only');
    for (const [k, v] of Object.entries(args)) {
        const type = schema.properties[k].type;
        if (type === 'integer') assert.ok(Number.isInteger(v), `${k} is an integer`);
        else assert.equal(typeof v, type, `${k} is a ${type}`);
    }
    return args;
}

async function tools_required_and_named_give_valid_calls() {
    const req = { model: MODEL, messages: CHAT, tools: TOOLS, tool_choice: 'required',
                  parallel_tool_calls: false, max_tokens: 400, temperature: 1, seed: 7 };
    const whole = await client.chat.completions.create(req, session());
    const m = whole.choices[0].message;
    assert.equal(whole.choices[0].finish_reason, 'tool_calls');
    assert.equal(m.tool_calls.length, 1, 'parallel_tool_calls false: one call');
    m.tool_calls.forEach((c) => checkCall(c));
    assert.ok(!m.content, 'no DSML or text beside the forced calls');

    // Streamed: the id and name first, then argument fragments, folding to the whole answer.
    const stream = await client.chat.completions.create({ ...req, stream: true }, session());
    const calls = [];
    let finish = null;
    for await (const chunk of stream) {
        for (const c of chunk.choices) {
            for (const tc of c.delta?.tool_calls ?? []) {
                if (!calls[tc.index]) {
                    assert.ok(tc.id && tc.function?.name, 'a call opens with its id and name');
                    calls[tc.index] = { name: tc.function.name, arguments: '' };
                }
                calls[tc.index].arguments += tc.function?.arguments ?? '';
            }
            assert.ok(!(c.delta?.content ?? '').includes('DSML'), 'no markup in content');
            if (c.finish_reason) finish = c.finish_reason;
        }
    }
    assert.equal(finish, 'tool_calls');
    assert.deepEqual(calls, m.tool_calls.map((c) => ({ name: c.function.name,
                                                       arguments: c.function.arguments })));

    const named = await client.chat.completions.create(
        { ...req, tool_choice: { type: 'function', function: { name: 'run_tests' } } }, session());
    assert.ok(named.choices[0].message.tool_calls.length >= 1);
    for (const c of named.choices[0].message.tool_calls) {
        assert.equal(c.function.name, 'run_tests');
        checkCall(c);
    }
}

async function tool_result_round_trip() {
    const name = `sdk-${RUN}-roundtrip`;
    const first = await client.chat.completions.create(
        { model: MODEL, messages: CHAT, tools: TOOLS, tool_choice: 'required',
          parallel_tool_calls: false, max_tokens: 400, temperature: 0 }, session(name));
    const m = first.choices[0].message;
    const results = m.tool_calls.map((c) => ({ role: 'tool', tool_call_id: c.id,
                                               content: `result of ${c.function.name}` }));
    const second = await client.chat.completions.create(
        { model: MODEL, messages: [...CHAT, m, ...results], tools: TOOLS, tool_choice: 'none',
          max_tokens: 12, temperature: 0 }, session(name));
    const c = second.choices[0];
    assert.ok(!c.message.tool_calls?.length, 'tool_choice none: no call');
    assert.ok(['stop', 'length'].includes(c.finish_reason));
    assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens);
    assert.ok(second.usage.prompt_tokens_details.cached_tokens > 0,
              'the turn with the tool results reuses the session');
}

async function run_tools_three_rounds() {
    const calls = [];
    const tool = (fname) => ({ type: 'function', function: {
        ...TOOLS.find((t) => t.function.name === fname).function,
        function: (args) => { calls.push({ fname, args }); return { ok: true, round: calls.length }; },
        parse: JSON.parse } });
    const runner = client.beta.chat.completions.runTools(
        { model: MODEL, messages: CHAT, tools: [tool('read_file'), tool('run_tests')],
          tool_choice: 'required', parallel_tool_calls: false, max_tokens: 400, temperature: 1,
          seed: 11 },
        { ...session(), maxChatCompletions: 3 });
    await runner.done();
    const rounds = runner.messages.filter((x) => x.role === 'assistant');
    assert.equal(rounds.length, 3, 'three model rounds');
    assert.equal(calls.length, 3, 'each round called one tool');
    const results = runner.messages.filter((x) => x.role === 'tool');
    assert.equal(results.length, calls.length);
    const final = await client.chat.completions.create(
        { model: MODEL, messages: runner.messages, tools: TOOLS, tool_choice: 'none',
          max_tokens: 8, temperature: 0 }, session());
    assert.ok(!final.choices[0].message.tool_calls?.length);
    assert.equal(typeof final.choices[0].message.content, 'string', 'a final answer');
}

const ANSWER_SCHEMA = {
    type: 'object', additionalProperties: false, required: ['done', 'kind', 'count', 'note'],
    properties: { done: { type: 'boolean' }, kind: { type: 'string', enum: ['bug', 'feature'] },
                  count: { type: 'integer' }, note: { type: ['string', 'null'] } },
};

async function json_schema_output_parses_and_validates() {
    for (const seed of [1, 2, 3]) {
        const r = await client.chat.completions.create(
            { model: MODEL, messages: CHAT, max_tokens: 1000, temperature: 1, seed,
              response_format: { type: 'json_schema',
                                 json_schema: { name: 'answer', strict: true,
                                                schema: ANSWER_SCHEMA } } }, session());
        const c = r.choices[0];
        assert.equal(c.finish_reason, 'stop', `the constraint closes the object (seed ${seed})`);
        const v = JSON.parse(c.message.content);
        assert.deepEqual(Object.keys(v).sort(), ['count', 'done', 'kind', 'note']);
        assert.equal(typeof v.done, 'boolean');
        assert.ok(['bug', 'feature'].includes(v.kind));
        assert.ok(Number.isInteger(v.count));
        assert.ok(v.note === null || typeof v.note === 'string');
    }
    const obj = await client.chat.completions.create(
        { model: MODEL, messages: CHAT, max_tokens: 200, temperature: 1, seed: 4,
          response_format: { type: 'json_object' } }, session());
    if (obj.choices[0].finish_reason === 'stop') {
        const v = JSON.parse(obj.choices[0].message.content);
        assert.equal(typeof v, 'object');
        assert.ok(v !== null && !Array.isArray(v));
    }
    await assert.rejects(client.chat.completions.create(
        { model: MODEL, messages: CHAT, max_tokens: 8,
          response_format: { type: 'json_schema', json_schema: { name: 'x', schema: {
              type: 'string', pattern: '^a' } } } }),
        (e) => e.status === 400 && /pattern/.test(e.message), 'an unsupported keyword is named');
}

async function reasoning_on_and_off() {
    const base = { model: MODEL, messages: CHAT, max_tokens: 8, temperature: 0 };
    const on = await client.chat.completions.create(
        { ...base, thinking: { type: 'enabled' } }, session());
    const m = on.choices[0].message;
    assert.equal(typeof m.reasoning_content, 'string');
    assert.ok(m.reasoning_content.length > 0, 'thinking mode: the output starts as reasoning');
    assert.ok(!(m.content ?? '').includes('</think>'));
    const kw = await client.chat.completions.create(
        { ...base, chat_template_kwargs: { thinking: true } }, session());
    assert.equal(kw.choices[0].message.reasoning_content, m.reasoning_content,
                 'chat_template_kwargs.thinking is the same switch');
    const off = await client.chat.completions.create(base, session());
    assert.equal(off.choices[0].message.reasoning_content, undefined, 'off by default');
    assert.ok(off.choices[0].message.content.length > 0);
    // streamed reasoning arrives as delta.reasoning_content
    const stream = await client.chat.completions.create(
        { ...base, thinking: { type: 'enabled' }, stream: true }, session());
    let reasoning = '';
    for await (const chunk of stream) {
        for (const c of chunk.choices) reasoning += c.delta?.reasoning_content ?? '';
    }
    assert.equal(reasoning, m.reasoning_content);
}

async function responses_with_tools_streamed_whole_chained() {
    const tools = TOOLS.map((t) => ({ type: 'function', ...t.function, strict: true }));
    const req = { model: MODEL, instructions: 'Use the tools.', input: CHAT[0].content, tools,
                  tool_choice: 'required', parallel_tool_calls: false, max_output_tokens: 400,
                  temperature: 0 };
    const whole = await client.responses.create(req, session());
    const fcs = whole.output.filter((o) => o.type === 'function_call');
    assert.ok(fcs.length >= 1, 'a function_call item');
    fcs.forEach((f) => checkCall({ type: 'function', id: f.call_id,
                                   function: { name: f.name, arguments: f.arguments } }));
    const stream = await client.responses.create({ ...req, stream: true }, session());
    let done = null;
    let final = null;
    for await (const ev of stream) {
        if (ev.type === 'response.function_call_arguments.done' && done === null) {
            done = ev.arguments;
        }
        if (ev.type === 'response.completed') final = ev.response;
    }
    assert.equal(done, fcs[0].arguments, 'streamed and whole calls agree');
    assert.ok(final);
    const next = await client.responses.create(
        { model: MODEL, instructions: 'Use the tools.', previous_response_id: whole.id, tools,
          tool_choice: 'none', max_output_tokens: 8, temperature: 0,
          input: fcs.map((f) => ({ type: 'function_call_output', call_id: f.call_id,
                                   output: 'ok' })) });
    assert.ok(!next.output.some((o) => o.type === 'function_call'));
    assert.ok(next.usage.input_tokens_details.cached_tokens > 0, 'the chained turn reuses KV');
}

const CASES = [
    models_list_and_retrieve,
    chat_whole_and_streamed,
    completions_whole_and_streamed,
    include_usage_cached_tokens_on_second_turn,
    n3_whole_and_streamed_reproducible,
    abort_mid_stream_then_normal_request,
    responses_whole_streamed_chained,
    tools_required_and_named_give_valid_calls,
    tool_result_round_trip,
    run_tools_three_rounds,
    json_schema_output_parses_and_validates,
    reasoning_on_and_off,
    responses_with_tools_streamed_whole_chained,
];

let failed = 0;
let ran = 0;
const t0 = Date.now();
for (const fn of CASES) {
    if (args.only && !args.only.includes(fn.name)) continue;
    const t = Date.now();
    ran++;
    try {
        await fn();
        console.log(`ok ${fn.name} (${Date.now() - t} ms)`);
    } catch (e) {
        failed++;
        console.log(`FAIL ${fn.name}: ${e?.stack ?? e}`);
    }
}
console.log(`sdk: ${ran - failed} passed, ${failed} failed in ${Date.now() - t0} ms`);
process.exit(failed > 0 ? 1 : 0);
