// bench/peer-llamacpp/gguf.mjs - a llama-architecture GGUF (v3) with random F16 weights, written
// directly (no gguf-py, no download), sized so that one decoded token reads a given number of
// weight bytes.
//
// GGUF v3, little-endian: "GGUF", u32 version 3, u64 tensor count, u64 metadata count; metadata
// key/value pairs (key: u64 length + bytes; u32 value type; value); tensor infos (name, u32
// n_dims, u64 dims with ne[0] - the contiguous one - first, u32 ggml type, u64 offset into the
// data section); padding to general.alignment (32); tensor data, each tensor at an aligned offset.
import fs from "node:fs";

const GGUF_ALIGN = 32;
const T = {U32: 4, I32: 5, F32: 6, BOOL: 7, STRING: 8, ARRAY: 9};
const GGML_F32 = 0;
const GGML_F16 = 1;
const TOKEN_NORMAL = 1, TOKEN_UNKNOWN = 2, TOKEN_CONTROL = 3, TOKEN_BYTE = 6;
export const FIRST_NORMAL_TOKEN = 3 + 256; // <unk> <s> </s>, then the 256 byte tokens

// Shape: n_embd and n_vocab as Tandem's checkpoint (hidden_size, vocab_size), n_head = n_embd / 64
// (head_dim 64), one KV head (Tandem's attention keeps one latent KV head, MQA); n_layer is
// Tandem's layer count, lowered until the FFN is at least n_embd wide; n_ff (a multiple of 16) then
// takes up the rest of the target. Bytes one decoded token reads: one token_embd row, every other
// tensor whole (the output matrix included).
export function planModel({targetBytes, nEmbd, nVocab, maxLayers}) {
    const headDim = 64;
    const base = {nEmbd, nVocab, nHead: Math.max(1, Math.floor(nEmbd / headDim)), nHeadKv: 1, headDim,
        contextLength: 4096};
    const readBytes = (p) => tensorList(p).reduce(
        (s, t) => s + (t.name === "token_embd.weight" ? t.dims[0] * 2 : t.bytes), 0);
    const ffnBytesPerUnit = 3 * nEmbd * 2; // gate, up, down: one more unit of n_ff, F16
    let plan = null;
    for (let nLayer = Math.max(1, maxLayers); nLayer >= 1 && !plan; nLayer--) {
        const without = readBytes({...base, nLayer, nFf: 0});
        const nFf = Math.round((targetBytes - without) / (nLayer * ffnBytesPerUnit) / 16) * 16;
        if (nFf >= nEmbd) plan = {...base, nLayer, nFf};
    }
    if (!plan) {
        const out = readBytes({...base, nLayer: 0, nFf: 0});
        throw new Error(`cannot fit a llama model of ${(targetBytes / 1e6).toFixed(1)} MB per token with ` +
            `n_embd ${nEmbd} and vocab ${nVocab} (the output matrix alone is ${(out / 1e6).toFixed(1)} MB)`);
    }
    plan.tensors = tensorList(plan);
    plan.readBytesPerToken = readBytes(plan);
    plan.fileTensorBytes = plan.tensors.reduce((s, t) => s + t.bytes, 0);
    // F16 KV cache: K and V rows of every layer, per token of context
    plan.kvBytesPerContextToken = plan.nLayer * 2 * plan.nHeadKv * plan.headDim * 2;
    return plan;
}

function tensorList(p) {
    const t = [];
    const add = (name, dims, type) => {
        const n = dims.reduce((a, b) => a * b, 1);
        t.push({name, dims, type, bytes: n * (type === GGML_F16 ? 2 : 4)});
    };
    const q = p.nHead * p.headDim, kv = p.nHeadKv * p.headDim;
    add("token_embd.weight", [p.nEmbd, p.nVocab], GGML_F16);
    for (let i = 0; i < p.nLayer; i++) {
        add(`blk.${i}.attn_norm.weight`, [p.nEmbd], GGML_F32);
        add(`blk.${i}.attn_q.weight`, [p.nEmbd, q], GGML_F16);
        add(`blk.${i}.attn_k.weight`, [p.nEmbd, kv], GGML_F16);
        add(`blk.${i}.attn_v.weight`, [p.nEmbd, kv], GGML_F16);
        add(`blk.${i}.attn_output.weight`, [q, p.nEmbd], GGML_F16);
        add(`blk.${i}.ffn_norm.weight`, [p.nEmbd], GGML_F32);
        add(`blk.${i}.ffn_gate.weight`, [p.nEmbd, p.nFf], GGML_F16);
        add(`blk.${i}.ffn_up.weight`, [p.nEmbd, p.nFf], GGML_F16);
        add(`blk.${i}.ffn_down.weight`, [p.nFf, p.nEmbd], GGML_F16);
    }
    add("output_norm.weight", [p.nEmbd], GGML_F32);
    add("output.weight", [p.nEmbd, p.nVocab], GGML_F16);
    return t;
}

class Buf {
    constructor() { this.parts = []; this.len = 0; }
    push(b) { this.parts.push(b); this.len += b.length; }
    u32(v) { const b = Buffer.alloc(4); b.writeUInt32LE(v); this.push(b); }
    i32(v) { const b = Buffer.alloc(4); b.writeInt32LE(v); this.push(b); }
    u64(v) { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(v)); this.push(b); }
    f32(v) { const b = Buffer.alloc(4); b.writeFloatLE(v); this.push(b); }
    str(s) { const b = Buffer.from(s, "utf8"); this.u64(b.length); this.push(b); }
    toBuffer() { return Buffer.concat(this.parts, this.len); }
}

function metadata(p) {
    const tokens = ["<unk>", "<s>", "</s>"];
    const types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL];
    for (let b = 0; b < 256; b++) {
        tokens.push(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
        types.push(TOKEN_BYTE);
    }
    // "\u2581" (SentencePiece's space) and printable ASCII as single-character pieces, so that text
    // round-trips through the tokenizer (node-llama-cpp checks that on load); then filler pieces
    for (const c of ["\u2581", ...Array.from({length: 94}, (_, i) => String.fromCharCode(0x21 + i))]) {
        tokens.push(c);
        types.push(TOKEN_NORMAL);
    }
    for (let i = tokens.length; i < p.nVocab; i++) {
        tokens.push(`\u2581t${i}`);
        types.push(TOKEN_NORMAL);
    }
    const scores = tokens.map((_, i) => (i < FIRST_NORMAL_TOKEN ? 0 : -i));
    return [
        ["general.architecture", T.STRING, "llama"],
        ["general.name", T.STRING, "tandem-peer-random-f16"],
        ["general.file_type", T.U32, 1], // MOSTLY_F16
        ["llama.context_length", T.U32, p.contextLength],
        ["llama.embedding_length", T.U32, p.nEmbd],
        ["llama.block_count", T.U32, p.nLayer],
        ["llama.feed_forward_length", T.U32, p.nFf],
        ["llama.attention.head_count", T.U32, p.nHead],
        ["llama.attention.head_count_kv", T.U32, p.nHeadKv],
        ["llama.rope.dimension_count", T.U32, p.headDim],
        ["llama.rope.freq_base", T.F32, 10000],
        ["llama.attention.layer_norm_rms_epsilon", T.F32, 1e-5],
        ["llama.vocab_size", T.U32, p.nVocab],
        ["tokenizer.ggml.model", T.STRING, "llama"],
        ["tokenizer.ggml.tokens", T.ARRAY, [T.STRING, tokens]],
        ["tokenizer.ggml.scores", T.ARRAY, [T.F32, scores]],
        ["tokenizer.ggml.token_type", T.ARRAY, [T.I32, types]],
        ["tokenizer.ggml.unknown_token_id", T.U32, 0],
        ["tokenizer.ggml.bos_token_id", T.U32, 1],
        ["tokenizer.ggml.eos_token_id", T.U32, 2],
        ["tokenizer.ggml.add_bos_token", T.BOOL, false],
        ["tokenizer.ggml.add_eos_token", T.BOOL, false],
    ];
}

function writeValue(b, type, v) {
    switch (type) {
    case T.U32: b.u32(v); break;
    case T.I32: b.i32(v); break;
    case T.F32: b.f32(v); break;
    case T.BOOL: b.push(Buffer.from([v ? 1 : 0])); break;
    case T.STRING: b.str(v); break;
    case T.ARRAY: {
        const [et, items] = v;
        b.u32(et);
        b.u64(items.length);
        for (const it of items) writeValue(b, et, it);
        break;
    }
    default: throw new Error(`gguf: value type ${type}`);
    }
}

const align = (n) => Math.ceil(n / GGUF_ALIGN) * GGUF_ALIGN;

// Random F16 values of magnitude in [2^-7, 2^-5) with a random sign (about 1/sqrt(n_embd) for
// n_embd 512..2048: activations stay finite and normal through the layers, so no NaN, infinity
// or subnormal ever reaches the kernels). Norm weights are 1.0 (F32).
function fillF16(u16, state) {
    let s = state.s;
    for (let i = 0; i < u16.length; i++) {
        s ^= s << 13; s >>>= 0;
        s ^= s >>> 17;
        s ^= s << 5; s >>>= 0;
        u16[i] = (s & 0x8000) | ((8 + ((s >>> 10) & 1)) << 10) | (s & 0x3ff);
    }
    state.s = s;
}

export function writeGguf(path, p, seed = 1) {
    const head = new Buf();
    const kv = metadata(p);
    head.push(Buffer.from("GGUF", "ascii"));
    head.u32(3);
    head.u64(p.tensors.length);
    head.u64(kv.length);
    for (const [k, type, v] of kv) {
        head.str(k);
        head.u32(type);
        writeValue(head, type, v);
    }
    let off = 0;
    for (const t of p.tensors) {
        t.offset = off;
        head.str(t.name);
        head.u32(t.dims.length);
        for (const d of t.dims) head.u64(d);
        head.u32(t.type);
        head.u64(off);
        off = align(off + t.bytes);
    }
    const fd = fs.openSync(path, "w");
    try {
        const hb = head.toBuffer();
        fs.writeSync(fd, hb);
        fs.writeSync(fd, Buffer.alloc(align(hb.length) - hb.length));
        const state = {s: (seed * 2654435761) >>> 0 || 1};
        const CHUNK = 1 << 22; // elements
        const scratch = new Uint16Array(CHUNK);
        let written = 0;
        for (const t of p.tensors) {
            if (t.type === GGML_F32) {
                const f = new Float32Array(t.bytes / 4).fill(1.0);
                fs.writeSync(fd, new Uint8Array(f.buffer));
            } else {
                for (let left = t.bytes / 2; left > 0;) {
                    const n = Math.min(left, CHUNK);
                    const view = scratch.subarray(0, n);
                    fillF16(view, state);
                    fs.writeSync(fd, new Uint8Array(view.buffer, 0, n * 2));
                    left -= n;
                }
            }
            written = t.offset + t.bytes;
            const pad = align(written) - written;
            if (pad) fs.writeSync(fd, Buffer.alloc(pad));
        }
    } finally {
        fs.closeSync(fd);
    }
}
