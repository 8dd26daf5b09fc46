#!/usr/bin/env bash
# TensorBoard event files and `trident report`, checked by readers someone
# else wrote:
#  - the events file's TFRecord framing with @roboflow/tfrecords' CRC32C
#    and mask (every length and data CRC checked), its Event and Summary
#    messages with protobufjs from a .proto text below (TensorBoard's field
#    numbers); every scalar equals metrics.jsonl's value as float32 (a
#    mixture of experts' router statistics too, as moe/<name>);
#  - a resumed run adds a second events file that continues the steps;
#  - the report (with a trace: per-rank step and idle times) rendered by
#    headless Chromium: each curve's colour is on the
#    screenshot, and not on the screenshot of the same page without curves;
#    the SVG paths hold a point per step;
#  - bad input: exit 2 naming the file (and line); unwritable output: exit 1.
# The npm packages are installed once into .tb-npm/ (ignored by git).
. "$(dirname "$0")/e2e.sh"
npm_dir=.tb-npm
if [ ! -f $npm_dir/node_modules/@roboflow/tfrecords/package.json ] ||
   [ ! -f $npm_dir/node_modules/protobufjs/package.json ]; then
    mkdir -p $npm_dir
    npm install --prefer-offline --prefix $npm_dir --no-audit --no-fund --loglevel=error \
        @roboflow/tfrecords@1.0.4 protobufjs@7.4.0 >/dev/null ||
        { echo "FAIL: npm install of @roboflow/tfrecords and protobufjs"; exit 1; }
fi
export NODE_PATH=$PWD/$npm_dir/node_modules

small=(--set model.layers=2 --set model.hidden=64 --set model.heads=4 --set model.seq_len=32
       --set data.val_every=3 --set data.val_sequences=8 --set run.log_every=100)
train() { # dir, extra args... (one rank, no mpiexec: as a user starts it)
    local dir=$1; shift
    timeout 300 "$TRIDENT" train configs/tiny.yaml "${small[@]}" --set run.dir="$dir" "$@" \
        > "$dir.log" 2>&1 || { echo "FAIL: train $dir exited $?"; tail -20 "$dir.log"; fails=$((fails + 1)); }
}
train "$out/r" --set training.steps=6 --set checkpoint.dir= --set training.trace=true
# Resumed: 3 steps, then the same config to 6 steps from its checkpoint.
train "$out/res" --set training.steps=3 --set checkpoint.dir="$out/res/ckpt" --set checkpoint.every=3
sleep 1 # a new second: the second file's name differs by time too
train "$out/res" --set training.steps=6 --set checkpoint.dir="$out/res/ckpt" --set checkpoint.every=3
# A mixture of experts: the router's statistics as moe/<name> scalars.
train "$out/moe" --set training.steps=6 --set checkpoint.dir= --set model.moe.experts=4 \
    --set model.moe.capacity_factor=1.0

# --- the events files, read by others' code -------------------------------
node - "$out/r" 6 1 "$out/res" 6 2 "$out/moe" 6 1 <<'JS' || fails=$((fails + 1))
const fs = require("fs"), path = require("path");
const { crc32c, maskCrc, readInt64 } = require("@roboflow/tfrecords/src/tensorFlowHelpers.js");
const protobuf = require("protobufjs");
// TensorBoard's tensorboard/compat/proto/event.proto and summary.proto,
// the fields a scalar log uses, with their numbers.
const root = protobuf.parse(`
  syntax = "proto3";
  package tensorboard;
  message SummaryMetadata { string display_name = 2; string summary_description = 3; }
  message Summary {
    message Value {
      string node_name = 7;
      string tag = 1;
      SummaryMetadata metadata = 9;
      oneof value { float simple_value = 2; bytes obsolete_old_style_histogram = 3; }
    }
    repeated Value value = 1;
  }
  message Event {
    double wall_time = 1;
    int64 step = 2;
    oneof what { string file_version = 3; bytes graph_def = 4; Summary summary = 5; }
  }`).root;
const Event = root.lookupType("tensorboard.Event");
let bad = 0;
const fail = (m) => { console.log("FAIL: " + m); bad++; };

function records(file) { // TFRecord frames, both CRCs checked
  const b = fs.readFileSync(file), out = [];
  let p = 0;
  while (p < b.length) {
    if (p + 12 > b.length) { fail(`${file}: torn header at ${p}`); break; }
    const lenBuf = b.slice(p, p + 8), n = readInt64(lenBuf);
    if (maskCrc(crc32c(lenBuf)) !== b.readUInt32LE(p + 8)) { fail(`${file}: length CRC at ${p}`); break; }
    const data = b.slice(p + 12, p + 12 + n);
    if (p + 16 + n > b.length) { fail(`${file}: torn record at ${p}`); break; }
    if (maskCrc(crc32c(data)) !== b.readUInt32LE(p + 12 + n)) { fail(`${file}: data CRC at ${p}`); break; }
    out.push(data);
    p += 16 + n;
  }
  return out;
}

const args = process.argv.slice(2);
for (let a = 0; a < args.length; a += 3) {
  const dir = args[a], steps = +args[a + 1], nfiles = +args[a + 2];
  const rows = fs.readFileSync(path.join(dir, "metrics.jsonl"), "utf8").trim().split("\n").map(JSON.parse);
  const files = fs.readdirSync(path.join(dir, "tb")).sort();
  if (files.length !== nfiles) fail(`${dir}/tb: ${files.length} files, expected ${nfiles}`);
  const re = /^events\.out\.tfevents\.(\d+)\.[^.].*\.(\d+)\.trident$/;
  const seen = {}; // step -> tag -> value
  let firstStepOfFile = [];
  for (const f of files) {
    if (!re.test(f)) fail(`${f}: not TensorBoard's naming`);
    const recs = records(path.join(dir, "tb", f)).map((d) => Event.toObject(Event.decode(d), { longs: Number }));
    if (!recs.length || recs[0].fileVersion !== "brain.Event:2") fail(`${f}: first event is not file_version brain.Event:2`);
    const summaries = recs.slice(1);
    firstStepOfFile.push(summaries.length ? summaries[0].step : -1);
    for (const e of summaries) {
      if (!e.summary || !(e.wallTime > 1.6e9)) fail(`${f}: event without summary or wall_time: ${JSON.stringify(e)}`);
      for (const v of e.summary.value) (seen[e.step] ??= {})[v.tag] = v.simpleValue;
    }
  }
  // Every metrics.jsonl value of every step is there, equal as float32; the
  // records of a step the resumed run redid are overwritten by the later.
  const want = {};
  let memStep = 0;
  for (const r of rows) {
    const w = (want[r.step] = {});
    for (const k of ["loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "mfu", "step_ms"])
      if (k in r) w[k] = r[k];
    if (r.memory_bytes) for (const [k, v] of Object.entries(r.memory_bytes)) w["memory_bytes/" + k] = v;
    for (const [k, v] of Object.entries(r)) if (k.startsWith("moe_")) w["moe/" + k.slice(4)] = v;
  }
  let compared = 0;
  for (let s = 1; s <= steps; s++) {
    const got = seen[s] || {}, w = want[s] || {};
    for (const k of Object.keys(w)) {
      if (!(k in got)) { fail(`${dir}: step ${s}: tag ${k} missing`); continue; }
      if (Math.fround(w[k]) !== got[k]) fail(`${dir}: step ${s} ${k}: events ${got[k]} != metrics ${w[k]}`);
      compared++;
    }
    for (const k of Object.keys(got)) if (!(k in w)) fail(`${dir}: step ${s}: tag ${k} not in metrics.jsonl`);
  }
  if (!seen[3] || !("val_loss" in seen[3]) || !("val_loss" in seen[6])) fail(`${dir}: val_loss at steps 3 and 6 missing`);
  if (!("memory_bytes/params" in (seen[1] || {})) || !(seen[1]["memory_bytes/params"] > 0)) fail(`${dir}: memory at step 1 missing`);
  if (nfiles === 2 && firstStepOfFile.join() !== "1,4") fail(`${dir}: files start at steps ${firstStepOfFile}, expected 1,4`);
  if (dir.endsWith("/moe") && !(seen[6] && "moe/aux_loss" in seen[6] && "moe/dropped" in seen[6]))
    fail(`${dir}: the router's scalars (moe/aux_loss, moe/dropped) missing at step 6`);
  console.log(`${dir}: ${files.length} events file(s), ${compared} scalars equal to metrics.jsonl`);
}
process.exit(bad ? 1 : 0);
JS

# run.tensorboard: false writes no events.
mkdir -p "$out/off"
train "$out/off/r" --set training.steps=1 --set checkpoint.dir= --set run.tensorboard=false
[ ! -e "$out/off/r/tb" ] || { echo "FAIL: run.tensorboard=false wrote $out/off/r/tb"; fails=$((fails + 1)); }

# An events file that cannot be written ends the run with exit 1, naming it.
mkdir -p "$out/blocked" && touch "$out/blocked/tb"
"$TRIDENT" train configs/tiny.yaml "${small[@]}" --set training.steps=1 --set checkpoint.dir= \
    --set run.dir="$out/blocked" > "$out/blocked.log" 2>&1
rc=$?
if [ $rc -ne 1 ] || ! grep -q "cannot write $out/blocked/tb" "$out/blocked.log"; then
    echo "FAIL: unwritable tb/: exit $rc"; cat "$out/blocked.log"; fails=$((fails + 1))
fi

# --- the report -----------------------------------------------------------
"$TRIDENT" report "$out/r" > "$out/report.log" 2>&1 ||
    { echo "FAIL: report exited $?"; cat "$out/report.log"; fails=$((fails + 1)); }
html=$out/r/report.html
python3 - "$html" <<'PY' || fails=$((fails + 1))
import re, sys
html = open(sys.argv[1]).read()
bad = []
paths = dict(re.findall(r'<path class="series" data-series="(\w+)" data-points="\d+" stroke="#\w+" d="([^"]*)"', html))
want = {"loss": 6, "val_loss": 2, "lr": 6, "grad_norm": 6, "tokens_per_s": 6, "mfu": 6}
for name, n in want.items():
    pts = re.findall(r"[ML]-?[\d.]+,-?[\d.]+", paths.get(name, ""))
    if len(pts) != n:
        bad.append(f"{name}: {len(pts)} points in its SVG path, expected {n}")
for needle in ["<h2>Memory per rank</h2>", "<td>params</td>", "model:", "layers: 2", "hidden: 64",
               "<h2>Per-rank step and idle time (trace.json)</h2>\n<table>", "<tr><td>0</td><td>6</td>"]:
    if needle not in html:
        bad.append(f"report lacks {needle!r}")
if re.search(r"<script|https?://(?!www\.w3\.org/2000/svg)", html):
    bad.append("report loads scripts or network resources")
for b in bad:
    print("FAIL:", b)
print(f"report: {len(paths)} curves with a point per step, memory table, trace table and config")
sys.exit(1 if bad else 0)
PY
# The resumed run's metrics.jsonl repeats no step here (it resumed from the
# last one); with a step recorded twice, the later record is plotted once.
tail -1 "$out/res/metrics.jsonl" >> "$out/res/metrics.jsonl"
"$TRIDENT" report "$out/res" > "$out/report_res.log" 2>&1 &&
    grep -q 'data-series="loss" data-points="6"' "$out/res/report.html" ||
    { echo "FAIL: report of the resumed run"; cat "$out/report_res.log"; fails=$((fails + 1)); }

# The same page without its curves: what the screenshot must differ by.
sed -e '/<path class="series"/d' -e '/<circle /d' "$html" > "$out/r/empty.html"
shot() { # html, png
    timeout 120 chromium --headless --disable-gpu --no-sandbox --hide-scrollbars \
        --user-data-dir="$out/chromium" --screenshot="$2" --window-size=1200,2400 "file://$1" \
        > "$out/chromium.log" 2>&1 && [ -s "$2" ] ||
        { echo "FAIL: chromium screenshot of $1"; tail -5 "$out/chromium.log"; fails=$((fails + 1)); }
}
shot "$html" "$out/report.png"
shot "$out/r/empty.html" "$out/empty.png"
# Debian's python3 with python3-pil (scripts/install_deps.sh), whatever
# python3 comes first on PATH.
/usr/bin/python3 - "$out/report.png" "$out/empty.png" <<'PY' || fails=$((fails + 1))
import sys
from PIL import Image
colors = {"loss": (0x1f, 0x77, 0xb4), "val_loss": (0xd6, 0x27, 0x28), "lr": (0x2c, 0xa0, 0x2c),
          "grad_norm": (0x94, 0x67, 0xbd), "tokens_per_s": (0xff, 0x7f, 0x0e), "mfu": (0x8c, 0x56, 0x4b)}
def counts(path):
    im = Image.open(path).convert("RGB")
    n = dict.fromkeys(colors, 0)
    for px in im.getdata():
        for name, c in colors.items():
            if abs(px[0] - c[0]) + abs(px[1] - c[1]) + abs(px[2] - c[2]) < 40:
                n[name] += 1
    return n
full, empty = counts(sys.argv[1]), counts(sys.argv[2])
bad = [f"{k}: {full[k]} pixels of its colour drawn, {empty[k]} without curves"
       for k in colors if full[k] - empty[k] < 150]
for b in bad:
    print("FAIL: curve not drawn:", b)
print("screenshot: curve pixels", {k: full[k] - empty[k] for k in colors})
sys.exit(1 if bad else 0)
PY

# Bad input: exit 2 naming what is wrong.
expect() { # code, text, args...
    local code=$1 text=$2; shift 2
    "$TRIDENT" report "$@" > "$out/bad.log" 2>&1
    local rc=$?
    if [ $rc -ne "$code" ] || ! grep -qF -- "$text" "$out/bad.log"; then
        echo "FAIL: report $*: exit $rc (want $code and '$text')"; cat "$out/bad.log"; fails=$((fails + 1))
    fi
}
expect 2 "missing RUN_DIR"
expect 2 "$out/nowhere" "$out/nowhere"
mkdir -p "$out/empty_dir"
expect 2 "$out/empty_dir/metrics.jsonl" "$out/empty_dir"
mkdir -p "$out/torn" && head -2 "$out/r/metrics.jsonl" > "$out/torn/metrics.jsonl"
echo '{"step": 3, "loss": 9.1' >> "$out/torn/metrics.jsonl"
expect 2 "$out/torn/metrics.jsonl:3" "$out/torn"
echo '[1, 2]' > "$out/torn/metrics.jsonl"
expect 2 "$out/torn/metrics.jsonl:1: not a JSON object" "$out/torn"
expect 1 "cannot write $out/no/such/dir/x.html" "$out/r" --out "$out/no/such/dir/x.html"
expect 0 "report: $out/x.html" "$out/r" --out "$out/x.html"

[ "$fails" -eq 0 ] || { echo "FAIL tensorboard: $fails check(s) failed"; exit 1; }
echo "PASS tensorboard"
