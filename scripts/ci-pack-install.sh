#!/usr/bin/env bash
# CI (issue 28): the package as a new host app gets it. `npm pack`, then a fresh app (its own fastify,
# the example host app's server: examples/host-app/src/server.ts) installs the tarball offline,
# type-checks against it, starts without any sluice environment variable (no SLUICE_ADDON: the
# package finds the addon its install script built) and serves a chat completion; the package's
# CLI and library then refuse the onnx backend, whose runtime (an optional peer dependency) is not
# installed, naming the command that adds it.
#
# Offline: the install runs with `npm install --offline` (npm's cache only) inside a network
# namespace with no network (`unshare -n`, as root; `unshare -rn` otherwise), so an install script
# that tries to download fails the install. Where neither namespace can be made, --offline alone
# (npm's own fetches) is what is proven, and the script says so. The cache must hold what a fresh
# resolution of sluice's dependency ranges picks: .ci/run runs this after the example host app's
# install, which resolves and fetches the same ranges online.
#
# SLUICE_CUDA=OFF for the install: the CPU addon is what is served here, and it builds in about a
# minute on 2 cores (CI's `npm ci` compiles the CUDA backend already). better-sqlite3's install script
# looks for a prebuilt binary on GitHub first; with no network it compiles from source (about a
# minute more). Usage: bash scripts/ci-pack-install.sh [--keep] (--keep leaves the temp dir).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
keep=0
[[ "${1:-}" == --keep ]] && keep=1
work=$(mktemp -d "${TMPDIR:-/tmp}/sluice-pack-install.XXXXXX")
server_pid=
cleanup() {
  [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null || true
  if ((keep)); then echo "pack-install: left $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
say() { printf 'pack-install [%3ds]: %s\n' "$SECONDS" "$*" >&2; }
fail() { say "FAILED: $*"; exit 1; }
SECONDS=0

# 1. The tarball, as `npm publish` would make it (prepare compiles the TypeScript first).
tarball=$(cd "$repo" && npm pack --silent --pack-destination "$work" | tail -1)
tarball="$work/$tarball"
[[ -f "$tarball" ]] || fail "npm pack made no tarball"
say "packed $(basename "$tarball") ($(du -k "$tarball" | cut -f1) KiB)"

# 2. A fresh app: its own fastify (sluice's peer), the example host app's server and tsconfig. Its
# allowScripts approves the two install scripts the app needs, sluice's (keyed by the tarball, as
# `npm approve-scripts sluice` writes it) and better-sqlite3's; onnxruntime-node is not installed.
app="$work/app"
mkdir -p "$app/src" "$work/home"
cp "$repo/examples/host-app/src/server.ts" "$repo/examples/host-app/tsconfig.json" "$app/"
mv "$app/server.ts" "$app/src/server.ts"
cat > "$app/package.json" <<EOF
{
  "name": "pack-install-app",
  "version": "0.0.0",
  "private": true,
  "type": "module",
  "dependencies": { "fastify": "^5.10.0", "sluice": "file:$tarball" },
  "devDependencies": { "@types/node": "^20.19.43" },
  "allowScripts": { "file:$tarball": true, "better-sqlite3": true }
}
EOF
# The library's refusal of the onnx backend, type-checked with the server.
cat > "$app/src/onnx-missing.ts" <<'EOF'
import { Engine, isSluiceError } from 'sluice';

try {
  const engine = await Engine.load({ model: process.argv[2]!, backend: 'onnx' });
  await engine.dispose();
  console.log(JSON.stringify({ loaded: true }));
} catch (err) {
  console.log(JSON.stringify(isSluiceError(err) ? { code: err.code, message: err.message } : { error: String(err) }));
}
EOF

# 3. The offline install.
netless=()
if unshare -n true 2>/dev/null; then netless=(unshare -n)
elif unshare -rn true 2>/dev/null; then netless=(unshare -rn)
else say "no network namespace here (unshare -n failed): install scripts are not cut off from the network, npm's fetches are (--offline)"
fi
say "installing the tarball, fastify and @types/node offline${netless:+ with no network (${netless[*]})}"
install_start=$SECONDS
if ! (cd "$app" && SLUICE_CUDA=OFF "${netless[@]}" npm install --offline --no-audit --no-fund --no-update-notifier) \
    > "$work/install.log" 2>&1; then
  tail -40 "$work/install.log" >&2
  grep -q ENOTCACHED "$work/install.log" && say "npm's cache lacks a package: run this after an online install of the same ranges (.ci/run's host-app step)"
  fail "the offline install failed (log above)"
fi
say "installed in $((SECONDS - install_start))s"
[[ -f "$app/node_modules/sluice/build/Release/sluice.node" ]] || fail "the install script built no addon"
[[ ! -e "$app/node_modules/onnxruntime-node" ]] || fail "onnxruntime-node was installed (it is an optional peer dependency)"

# 4. Type-check and compile the app against the installed package (this repository's tsc).
(cd "$app" && node "$repo/node_modules/typescript/bin/tsc" -p .) || fail "the app does not type-check against the package"
say "the app type-checks against the installed package"

# 5. Start it with a bare environment: PATH, a fresh HOME, and the example's own PORT=0 (a free port).
(cd "$app" && exec env -i PATH="$PATH" HOME="$work/home" PORT=0 node dist/server.js > "$work/server.log" 2>&1) &
server_pid=$!
origin=
for _ in $(seq 1 180); do
  origin=$(grep -o 'Server listening at http://[0-9.:]*' "$work/server.log" | head -1 | sed 's/Server listening at //' || true)
  [[ -n "$origin" ]] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; fail "the app exited"; }
  sleep 0.5
done
[[ -n "$origin" ]] || { cat "$work/server.log" >&2; fail "the app did not start in 90 s"; }
key=$(grep -o 'sk-sluice-[A-Za-z0-9_-]*' "$work/server.log" | head -1)
say "the app listens at $origin"

# 6. One real request through the whole stack (tiny demo model, random weights: the text is gibberish).
ORIGIN="$origin" KEY="$key" node --input-type=module -e '
const { ORIGIN, KEY } = process.env;
const hello = await (await fetch(`${ORIGIN}/hello?name=ci`)).json();
if (hello.hello !== "ci") throw new Error(`/hello answered ${JSON.stringify(hello)}`);
const res = await fetch(`${ORIGIN}/llm/v1/chat/completions`, {
  method: "POST",
  headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
  body: JSON.stringify({ model: "tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 4, temperature: 0 }),
});
const body = await res.json();
const choice = body.choices?.[0];
if (res.status !== 200 || body.object !== "chat.completion" || typeof choice?.message?.content !== "string"
    || choice.finish_reason !== "length" || body.usage?.completion_tokens !== 4) {
  throw new Error(`chat completion: ${res.status} ${JSON.stringify(body)}`);
}
console.error(`pack-install: chat completion 200, ${body.usage.completion_tokens} tokens: ${JSON.stringify(choice.message.content)}`);
' || fail "the request failed"
kill -TERM "$server_pid"
wait "$server_pid" || fail "the app did not stop cleanly on SIGTERM (exit $?)"
server_pid=

# 7. The onnx backend without its runtime: the CLI and the library name the command that adds it.
(cd "$app" && ./node_modules/.bin/sluice make-model --preset tiny --out "$work/tiny-onnx" --onnx fp32 > /dev/null 2>&1) \
  || fail "sluice make-model --onnx failed"
if (cd "$app" && env -i PATH="$PATH" HOME="$work/home" ./node_modules/.bin/sluice serve --model "$work/tiny-onnx" \
    --backend onnx --port 0 --data-dir "$work/onnx-data") > "$work/onnx-cli.log" 2>&1; then
  fail "sluice serve --backend onnx started without onnxruntime-node"
fi
grep -q 'npm install onnxruntime-node@' "$work/onnx-cli.log" || { cat "$work/onnx-cli.log" >&2; fail "sluice serve --backend onnx did not say how to add onnxruntime-node"; }
lib=$(cd "$app" && env -i PATH="$PATH" HOME="$work/home" node dist/onnx-missing.js "$work/tiny-onnx")
[[ "$lib" == *'"code":"backend_unavailable"'*'npm install onnxruntime-node@'* ]] || fail "Engine.load({backend: 'onnx'}) answered $lib"
say "without onnxruntime-node, serve --backend onnx and Engine.load say: $(tail -1 "$work/onnx-cli.log")"
say "passed"
