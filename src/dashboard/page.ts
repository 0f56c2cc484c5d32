// The dashboard's page and style sheet: fixed text, the same for every visitor. The page holds no
// data and no secret; its script (client.ts) fetches GET /dashboard/data with the admin key the
// visitor gives it and fills the page. Served with a Content-Security-Policy that allows scripts,
// styles and fetches from this origin only (api/dashboard-route.ts).

export const DASHBOARD_HTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>sluice dashboard</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="dashboard/app.css">
<script src="dashboard/app.js" defer></script>
</head>
<body>
<header>
  <h1>sluice</h1>
  <span id="status">loading…</span>
  <button id="forget" type="button">Forget key</button>
</header>
<form id="key-form" hidden>
  <label>Admin API key <input id="key-input" type="password" autocomplete="off" required></label>
  <button type="submit">Open</button>
  <p class="hint">A key made with <code>sluice keys create --org NAME --admin</code>. It stays in this tab (sessionStorage).</p>
</form>
<main id="board" hidden>
  <section class="cards">
    <div class="card wide">
      <div class="label">Generated tokens/s</div>
      <div class="value" id="generation-rate">–</div>
      <div class="note" id="rate-interval"></div>
    </div>
    <div class="card"><div class="label">Prompt tokens/s</div><div class="value" id="prompt-rate">–</div></div>
    <div class="card"><div class="label">Engine tokens/s</div><div class="value" id="computed-rate">–</div></div>
    <div class="card"><div class="label">Generations</div><div class="value" id="total-generations">–</div></div>
    <div class="card"><div class="label">Prompt tokens</div><div class="value" id="total-prompt-tokens">–</div></div>
    <div class="card"><div class="label">Generated tokens</div><div class="value" id="total-generation-tokens">–</div></div>
    <div class="card"><div class="label">HTTP requests</div><div class="value" id="total-http-requests">–</div></div>
  </section>
  <section>
    <h2><span id="history-title">The last minutes</span> <span class="note" id="history-note"></span></h2>
    <div class="plots">
      <figure class="plot">
        <figcaption>Output tokens/s <span class="note" id="plot-output-caption"></span></figcaption>
        <svg id="plot-output" viewBox="0 0 400 140" role="img" aria-label="output tokens per second over the last minutes"></svg>
      </figure>
      <figure class="plot">
        <figcaption>Requests/s <span class="note">(generations that ended)</span> <span class="note" id="plot-requests-caption"></span></figcaption>
        <svg id="plot-requests" viewBox="0 0 400 140" role="img" aria-label="requests per second over the last minutes"></svg>
      </figure>
      <figure class="plot">
        <figcaption>Queue <span class="key key-running">running</span> <span class="key key-waiting">waiting</span>
          <span class="note" id="plot-queue-caption"></span></figcaption>
        <svg id="plot-queue" viewBox="0 0 400 140" role="img" aria-label="sequences running and waiting over the last minutes"></svg>
      </figure>
    </div>
  </section>
  <section>
    <h2>Queues and KV cache</h2>
    <div id="models" class="models"></div>
  </section>
  <section>
    <h2>Usage and cost by organization</h2>
    <table id="orgs">
      <thead><tr><th>organization</th><th class="num">requests</th><th class="num">input tokens</th><th class="num">cached</th><th class="num">output tokens</th><th class="num">cost (USD)</th></tr></thead>
      <tbody id="org-rows"></tbody>
    </table>
  </section>
  <section>
    <h2>Recent requests</h2>
    <table id="recent">
      <thead><tr><th>time</th><th>route</th><th class="num">status</th><th>organization</th><th class="num">tokens in / out</th><th class="num">duration</th></tr></thead>
      <tbody id="recent-rows"></tbody>
    </table>
  </section>
</main>
</body>
</html>
`;

export const DASHBOARD_CSS = `
:root { --ink: #1d2330; --muted: #667085; --line: #e4e7ec; --bg: #f6f7f9; --card: #fff; --accent: #2563eb; --cached: #93c5fd; --ok: #16a34a; --warn: #d97706; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: var(--ink); background: var(--bg); }
header { display: flex; align-items: center; gap: 16px; padding: 12px 24px; background: var(--ink); color: #fff; }
header h1 { margin: 0; font-size: 20px; letter-spacing: 0.5px; }
#status { flex: 1; color: #cbd5e1; }
button { font: inherit; padding: 4px 12px; border-radius: 6px; border: 1px solid var(--line); background: #fff; color: var(--ink); cursor: pointer; }
form { margin: 24px; padding: 16px; background: var(--card); border: 1px solid var(--line); border-radius: 8px; max-width: 640px; }
form input { font: inherit; padding: 4px 8px; width: 320px; margin: 0 8px; }
.hint { color: var(--muted); margin-bottom: 0; }
main { padding: 16px 24px 32px; }
section { margin-bottom: 24px; }
h2 { font-size: 16px; margin: 0 0 8px; }
h3 { font-size: 14px; margin: 0 0 8px; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(130px, 1fr)); gap: 12px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 12px; }
.card.wide { grid-column: span 2; }
.label, .note { color: var(--muted); font-size: 12px; }
.value { font-size: 24px; font-weight: 600; font-variant-numeric: tabular-nums; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(360px, 1fr)); gap: 12px; }
.plot { margin: 0; background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px 6px; }
.plot figcaption { font-weight: 500; margin-bottom: 4px; }
.plot svg { display: block; width: 100%; height: auto; }
.plot .grid { stroke: var(--line); stroke-width: 1; }
.plot .axis { fill: var(--muted); font-size: 11px; font-variant-numeric: tabular-nums; }
.plot polyline { fill: none; stroke-width: 2; stroke-linejoin: round; }
.series-output, .series-running { stroke: var(--accent); }
.series-requests { stroke: var(--ok); }
.series-waiting { stroke: var(--warn); }
.key::before { content: ""; display: inline-block; width: 10px; height: 3px; margin: 0 4px 3px 6px; vertical-align: middle; }
.key-running::before { background: var(--accent); }
.key-waiting::before { background: var(--warn); }
h2 .note { font-weight: 400; }
.models { display: grid; grid-template-columns: repeat(auto-fill, minmax(320px, 1fr)); gap: 12px; }
.model { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 12px; }
.kv-bar { display: flex; height: 14px; margin-top: 10px; border-radius: 4px; overflow: hidden; background: var(--line); }
.kv-used { background: var(--accent); }
.kv-cached { background: var(--cached); }
.kv-free { background: var(--line); }
.kv-legend { margin: 6px 0 0; color: var(--muted); font-size: 12px; }
table { border-collapse: collapse; width: 100%; background: var(--card); }
section > table { border: 1px solid var(--line); }
th, td { text-align: left; padding: 5px 10px; border-bottom: 1px solid var(--line); white-space: nowrap; }
th { color: var(--muted); font-weight: 500; font-size: 12px; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.total td { font-weight: 600; border-top: 2px solid var(--line); }
tr.error td { color: #b42318; }
`;
