// The peers of bench/bench_tokenize.c for bench/tokenize.sh: OpenAI's
// tiktoken compiled to WebAssembly (npm @dqbd/tiktoken) and js-tiktoken,
// timed the same way.
//   node tokenize_ref.js dqbd|js PKG ENCODING REPEAT FILE...
// Each file is a document (read as UTF-8 before timing); the list is taken
// REPEAT times; every document is encoded on its own with special-token
// text as ordinary text (encode_ordinary / encode(text, [], [])), as
// trident does.  An untimed warm-up (JIT, WebAssembly tiering) encodes the
// first 50 documents.  Prints one line in bench_tokenize's format.
const fs = require("fs");
const [kind, pkg, encoding, repeatArg, ...files] = process.argv.slice(2);
const repeat = Number(repeatArg);
let encode, free = () => {};
if (kind === "dqbd") {
  const enc = require(pkg).get_encoding(encoding);
  encode = text => enc.encode_ordinary(text).length;
  free = () => enc.free();
} else {
  const enc = require(pkg).getEncoding(encoding);
  encode = text => enc.encode(text, [], []).length;
}
const docs = files.map(f => fs.readFileSync(f, "utf8"));
const bytes = docs.reduce((s, d) => s + Buffer.byteLength(d, "utf8"), 0) * repeat;
for (const d of docs.slice(0, 50)) encode(d);
const t0 = process.hrtime.bigint();
let tokens = 0;
for (let r = 0; r < repeat; r++) for (const d of docs) tokens += encode(d);
const s = Number(process.hrtime.bigint() - t0) / 1e9;
free();
const name = kind === "dqbd" ? "tiktoken-wasm" : "js-tiktoken";
console.log(`${name} ${encoding} threads 1: ${bytes} bytes, ${tokens} tokens, ${s.toFixed(4)} s, ` +
            `${(bytes / s / 1e6).toFixed(2)} MB/s, ${Math.round(tokens / s)} tokens/s`);
