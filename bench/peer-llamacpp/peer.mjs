// bench/peer-llamacpp/peer.mjs - the measurement behind bench/peer-llamacpp/run (read its --help).
// Settings come from the environment the run script sets: PEER_BIN, PEER_MODEL, PEER_ROUNDS,
// PEER_TOKENS, PEER_PROMPT.
import {spawnSync} from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import {FIRST_NORMAL_TOKEN, planModel, writeGguf} from "./gguf.mjs";

const BIN = process.env.PEER_BIN;
const ROUNDS = Number(process.env.PEER_ROUNDS || 3);
const TOKENS = Number(process.env.PEER_TOKENS || 64);
const PROMPT = Number(process.env.PEER_PROMPT || 16);
const HERE = path.dirname(new URL(import.meta.url).pathname);

const work = fs.mkdtempSync(path.join(os.tmpdir(), "peer-llamacpp."));
const cleanup = () => fs.rmSync(work, {recursive: true, force: true});
for (const sig of ["SIGINT", "SIGTERM"]) {
    process.on(sig, () => { cleanup(); process.exit(130); });
}
const fail = (msg) => { console.error(`peer-llamacpp: ${msg}`); cleanup(); process.exit(1); };
const median = (xs) => {
    const s = [...xs].sort((a, b) => a - b);
    const m = s.length >> 1;
    return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

function run(exe, args) {
    const r = spawnSync(path.join(BIN, exe), args, {encoding: "utf8", maxBuffer: 1 << 26});
    if (r.error || r.status !== 0) {
        fail(`${exe} ${args.join(" ")} failed (${r.error ? r.error.message : `exit ${r.status}`}):\n` +
            `${r.stdout || ""}${r.stderr || ""}`);
    }
    return r.stdout;
}

// One tandem-bench-engine decode run at batch 1, one thread: tok/s and the bytes one step read.
function tandemDecode(modelDir, steps) {
    const out = run("tandem-bench-engine", ["--model", modelDir, "--threads", "1", "--decode-only",
        "--batches", "1", "--context", String(PROMPT), "--steps", String(steps), "--repeat", "1"]);
    const m = out.match(/decode batch\s+1: (\S+) ([\d.]+) tok\/s .*?\(([\d.]+) MB weights \+ ([\d.]+) MB KV\/step, (?:memcpy|read) ([\d.]+) GB\/s[;)]/);
    if (!m) fail(`cannot read the decode line of tandem-bench-engine:\n${out}`);
    if (m[1] !== "TDM_OK") fail(`tandem-bench-engine decode returned ${m[1]}:\n${out}`);
    const c = out.match(/CPU-time rate ([\d.]+) steps\/s/); // batch 1: steps = tokens
    return {tokS: Number(m[2]), weightsMB: Number(m[3]), kvMB: Number(m[4]), memcpyGBs: Number(m[5]),
        cpuTokS: c ? Number(c[1]) : NaN};
}

function cpuInfo() {
    let text = "";
    try { text = fs.readFileSync("/proc/cpuinfo", "utf8"); } catch { /* not Linux */ }
    const model = (text.match(/^model name\s*:\s*(.*)$/m) || [])[1] || os.cpus()[0]?.model || "unknown";
    const avx512f = /^flags\s*:.*\bavx512f\b/m.test(text);
    return {model, avx512f};
}

// ---- Tandem checkpoint and its bytes per token --------------------------------------------
const cpu = cpuInfo();
let modelDir = process.env.PEER_MODEL || "";
if (!modelDir) {
    modelDir = path.join(work, "small");
    run("tandem-mkmodel", ["--preset", "small", "--seed", "1", "--out", modelDir]);
}
let cfg;
try {
    const c = JSON.parse(fs.readFileSync(path.join(modelDir, "config.json"), "utf8"));
    cfg = c.text_config || c;
} catch (e) {
    fail(`cannot read ${modelDir}/config.json: ${e.message}`);
}
// warm-up run, not timed: also gives the weight bytes per token that size the GGUF
const sizing = tandemDecode(modelDir, 32);
const targetBytes = sizing.weightsMB * 1e6;

// ---- the GGUF and node-llama-cpp ----------------------------------------------------------
let plan;
try {
    plan = planModel({targetBytes, nEmbd: cfg.hidden_size, nVocab: cfg.vocab_size,
        maxLayers: cfg.num_hidden_layers});
} catch (e) {
    fail(e.message);
}
const ggufPath = path.join(work, "peer-f16.gguf");
writeGguf(ggufPath, plan, 1);

let nlc, llama;
try {
    nlc = await import("node-llama-cpp");
    llama = await nlc.getLlama({gpu: false, build: "never", maxThreads: 1,
        logLevel: nlc.LlamaLogLevel.error});
} catch (e) {
    console.log(`skip: node-llama-cpp has no prebuilt llama.cpp that loads here: ${e.message}`);
    cleanup();
    process.exit(0);
}
const nlcVersion = JSON.parse(fs.readFileSync(
    path.join(HERE, "node_modules", "node-llama-cpp", "package.json"), "utf8")).version;
const model = await llama.loadModel({modelPath: ggufPath, gpuLayers: 0});
const context = await model.createContext({threads: {ideal: 1, min: 1}, sequences: 1,
    contextSize: 4096, batchSize: Math.min(512, Math.max(32, PROMPT))});
const sequence = context.getSequence();
const cpuBackend = [...new Set(fs.readFileSync("/proc/self/maps", "utf8")
    .match(/libggml-cpu[^\s/]*\.so/g) || [])].join(", ") || "?";

// prompt: PROMPT ordinary token ids; then TOKENS greedy decode steps, timed from the first
// sampled token (the prompt's) to the last
const promptTokens = Array.from({length: PROMPT},
    (_, i) => FIRST_NORMAL_TOKEN + ((i * 7919 + 13) % (plan.nVocab - FIRST_NORMAL_TOKEN)));
async function llamaDecode(steps) {
    await sequence.clearHistory();
    let n = -1;
    let t0 = 0;
    let c0 = null;
    for await (const _ of sequence.evaluate(promptTokens, {temperature: 0, yieldEogToken: true})) {
        if (n < 0) {
            t0 = performance.now();
            c0 = process.cpuUsage();
        }
        if (++n >= steps) break;
    }
    const wall = (performance.now() - t0) / 1e3;
    const cpu = process.cpuUsage(c0);
    if (n < steps) fail(`llama.cpp stopped after ${n} of ${steps} tokens`);
    return {tokS: steps / wall, cpuTokS: steps / ((cpu.user + cpu.system) / 1e6)};
}
// bytes read per decoded token: the weights (plan) + the F16 KV of the tokens attended to, on
// average PROMPT + (TOKENS + 1) / 2 of them
const llamaKvBytes = plan.kvBytesPerContextToken * (PROMPT + (TOKENS + 1) / 2);
const llamaBytes = plan.readBytesPerToken + llamaKvBytes;

console.log(`peer-llamacpp: decode at batch 1, one thread each, ${ROUNDS} rounds alternating ` +
    `(Tandem, llama.cpp), prompt ${PROMPT} tokens, ${TOKENS} decoded tokens timed per round`);
console.log(`cpu: ${cpu.model}; avx512f: ${cpu.avx512f ? "yes" : "no"}; ${os.cpus().length} ` +
    `logical cpus; load average ${os.loadavg()[0].toFixed(2)}`);
console.log(`tandem: ${path.join(BIN, "tandem-bench-engine")}, checkpoint ` +
    `${process.env.PEER_MODEL || "small preset, seed 1"} (${cfg.num_hidden_layers} layers, ` +
    `hidden ${cfg.hidden_size}, vocab ${cfg.vocab_size}): ${sizing.weightsMB.toFixed(1)} MB weights ` +
    `per token`);
console.log(`llama.cpp: node-llama-cpp ${nlcVersion} (${llama.llamaCppRelease.repo} ` +
    `${llama.llamaCppRelease.release}, ${llama.buildType}, ${cpuBackend}, ${context.currentThreads} ` +
    `thread), GGUF llama F16 (random): ${plan.nLayer} layers, n_embd ${plan.nEmbd}, n_ff ` +
    `${plan.nFf}, heads ${plan.nHead}/${plan.nHeadKv} kv, vocab ${plan.nVocab}: ` +
    `${(plan.readBytesPerToken / 1e6).toFixed(1)} MB weights per token`);

await llamaDecode(Math.min(TOKENS, 16)); // warm-up, not timed
const tRuns = [];
const lRuns = [];
for (let r = 1; r <= ROUNDS; r++) {
    const t = tandemDecode(modelDir, TOKENS);
    const l = await llamaDecode(TOKENS);
    tRuns.push(t);
    lRuns.push(l);
    console.log(`round ${r}: tandem ${t.tokS.toFixed(1)} tok/s, llama.cpp ${l.tokS.toFixed(1)} ` +
        `tok/s; per CPU second ${t.cpuTokS.toFixed(1)} and ${l.cpuTokS.toFixed(1)}`);
}
await context.dispose();
await model.dispose();
await llama.dispose();

const stats = (xs) => ({med: median(xs), lo: Math.min(...xs), hi: Math.max(...xs)});
const tTok = stats(tRuns.map((t) => t.tokS));
const lTok = stats(lRuns.map((l) => l.tokS));
const tCpu = median(tRuns.map((t) => t.cpuTokS));
const lCpu = median(lRuns.map((l) => l.cpuTokS));
const tBytes = (median(tRuns.map((t) => t.weightsMB)) + median(tRuns.map((t) => t.kvMB))) * 1e6;
const row = (name, tok, cpuTok, bytes) => console.log(
    `${name.padEnd(10)} ${tok.med.toFixed(1).padStart(7)} ${`${tok.lo.toFixed(1)}-${tok.hi.toFixed(1)}`.padStart(12)}` +
    `  ${(bytes / 1e6).toFixed(2).padStart(8)}  ${(tok.med * bytes / 1e9).toFixed(2).padStart(7)}` +
    `  ${cpuTok.toFixed(1).padStart(9)}  ${(cpuTok * bytes / 1e9).toFixed(2).padStart(7)}`);
console.log("system       tok/s    (min-max)  MB/token     GB/s  cpu tok/s  cpu GB/s");
row("tandem", tTok, tCpu, tBytes);
row("llama.cpp", lTok, lCpu, llamaBytes);
const ratio = (tTok.med * tBytes) / (lTok.med * llamaBytes);
const cpuRatio = (tCpu * tBytes) / (lCpu * llamaBytes);
console.log(`ratio tandem / llama.cpp of effective GB/s: ${ratio.toFixed(2)} (per CPU second: ` +
    `${cpuRatio.toFixed(2)})`);
console.log(`(tok/s: median decode rate of the rounds; MB/token: bytes read per decoded token, ` +
    `weights + KV; GB/s = tok/s x MB/token; cpu: the same per process CPU second, near an ` +
    `uncontended box's rate when this one is shared; memory roofline ` +
    `${median(tRuns.map((t) => t.memcpyGBs)).toFixed(2)} GB/s as tandem-bench-engine measured it)`);
cleanup();
