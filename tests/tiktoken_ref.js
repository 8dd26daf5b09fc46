// The reference side of tests/test_prepare_inputs.sh: js-tiktoken's ids.
//   node tiktoken_ref.js PKG ENCODING bin OUT.bin FILE...   every file's ids, then EOT,
//                                                           as int32 (a Megatron .bin)
//   node tiktoken_ref.js PKG ENCODING ids FILE              the ids of one file, one per line
// Files are read as UTF-8 with replacement (as trident reads them); text that
// spells a special token is ordinary text (encode(text, [], [])), as in trident.
const fs = require("fs");
const [pkg, encoding, mode, ...rest] = process.argv.slice(2);
const { getEncoding } = require(pkg);
const enc = getEncoding(encoding);
const eot = { cl100k_base: 100257, o200k_base: 199999 }[encoding];
if (mode === "bin") {
  const [out, ...files] = rest;
  const parts = [];
  let n = 0;
  const t0 = process.hrtime.bigint();
  for (const f of files) {
    const ids = enc.encode(fs.readFileSync(f, "utf8"), [], []);
    ids.push(eot);
    parts.push(Int32Array.from(ids));
    n += ids.length;
  }
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  fs.writeFileSync(out, Buffer.concat(parts.map(p => Buffer.from(p.buffer))));
  console.log(`${files.length} documents, ${n} tokens, encoded in ${s.toFixed(2)} s (${Math.round(n / s)} tokens/s)`);
} else {
  const ids = enc.encode(fs.readFileSync(rest[0], "utf8"), [], []);
  process.stdout.write(ids.map(i => i + "\n").join(""));
}
