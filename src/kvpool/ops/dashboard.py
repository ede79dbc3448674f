"""`/dashboard`: one self-contained HTML page over the master's JSON endpoints.

No CDN and no library: plain DOM, inline SVG bars and a canvas chart. The page polls
`/api/v1/stats` every second (segments, clients, request counts, reclaim counters) and
`/api/v1/tenants` every ten seconds, and keeps the last five minutes of rates in memory, so
ops/s, hit ratio and evictions/s draw live. Every element a test or an operator looks for has an
id: `#objects`, `#capacity`, `#used`, `#segments` (one `tr.segment` per segment), `#clients`,
`#tenants`, `#ops-chart`, `#ops-now`, `#hit-ratio`, `#evictions-now`, `#status`.

A master with credentials answers the JSON paths to admin tokens only (`kvpool.ops.admin`): on
a 401 or 403 the page shows `#auth` (a password field `#token`); the token typed there, or
given as `#token=...` in the page's URL (a fragment: it never reaches a server or a log), is
kept in the tab's sessionStorage and sent as `Authorization: Bearer` with every request.
"""

from __future__ import annotations

__all__ = ["DASHBOARD_HTML"]

DASHBOARD_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>kvpool dashboard</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; background: #f5f6f8; color: #1d2330; }
  header { background: #1d2330; color: #fff; padding: 10px 20px; display: flex; gap: 24px;
           align-items: baseline; }
  header h1 { font-size: 18px; margin: 0; }
  header .muted { color: #aab; }
  main { display: grid; grid-template-columns: repeat(auto-fit, minmax(400px, 1fr)); gap: 16px;
         padding: 16px 20px; }
  section { background: #fff; border-radius: 6px; padding: 12px 16px;
            box-shadow: 0 1px 2px rgba(0,0,0,.08); }
  section h2 { font-size: 15px; margin: 0 0 8px; }
  .cards { display: flex; gap: 12px; flex-wrap: wrap; }
  .card { min-width: 110px; }
  .card .v { font-size: 22px; font-weight: 600; }
  .card .k { color: #667; font-size: 12px; }
  table { border-collapse: collapse; width: 100%; }
  th, td { text-align: left; padding: 3px 6px; border-bottom: 1px solid #eee; font-size: 13px;
           white-space: nowrap; }
  section.wide { grid-column: span 2; }
  .scroll { overflow-x: auto; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  .state-serving { color: #187a3a; } .state-draining { color: #b36b00; }
  .state-silent { color: #b00020; }
  canvas { width: 100%; height: 180px; }
  .legend span { margin-right: 12px; font-size: 12px; }
  .legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
  #status.error { color: #ff8a8a; }
  #auth { display: none; gap: 6px; align-items: baseline; }
  #auth.shown { display: flex; }
</style>
</head>
<body>
<header>
  <h1>kvpool</h1>
  <span id="role" class="muted">-</span>
  <span id="uptime" class="muted">-</span>
  <span id="status" class="muted">connecting...</span>
  <form id="auth">
    <label for="token" class="muted">admin token</label>
    <input id="token" type="password" autocomplete="off" size="24">
    <button type="submit">use</button>
  </form>
</header>
<main>
  <section>
    <h2>Pool</h2>
    <div class="cards">
      <div class="card"><div class="v" id="objects">-</div><div class="k">objects</div></div>
      <div class="card"><div class="v" id="used">-</div><div class="k">used</div></div>
      <div class="card"><div class="v" id="capacity">-</div><div class="k">capacity</div></div>
      <div class="card"><div class="v" id="ops-now">-</div><div class="k">requests/s</div></div>
      <div class="card"><div class="v" id="hit-ratio">-</div><div class="k">get hit ratio</div>
      </div>
      <div class="card"><div class="v" id="evictions-now">-</div><div class="k">evictions/s</div>
      </div>
    </div>
    <svg id="pool-bar" width="100%" height="14" role="img" aria-label="pool used / free"></svg>
  </section>
  <section>
    <h2>Throughput (last 5 minutes)</h2>
    <canvas id="ops-chart" width="800" height="180"></canvas>
    <div class="legend">
      <span><i style="background:#2f6fde"></i>puts/s</span>
      <span><i style="background:#1f9d55"></i>gets/s</span>
      <span><i style="background:#d9822b"></i>evictions/s</span>
    </div>
  </section>
  <section class="wide">
    <h2>Segments</h2>
    <div class="scroll"><table><thead><tr><th>segment</th><th>state</th><th>used / free</th><th>used</th>
      <th>capacity</th><th>objects</th></tr></thead><tbody id="segments"></tbody></table></div>
  </section>
  <section>
    <h2>Reclaim</h2>
    <table><tbody id="reclaim"></tbody></table>
  </section>
  <section>
    <h2>Clients</h2>
    <div class="scroll"><table><thead><tr><th>client</th><th>host</th><th>segments</th><th>puts pending</th>
      <th>ttl left</th></tr></thead><tbody id="clients"></tbody></table></div>
  </section>
  <section>
    <h2>Top tenants</h2>
    <table><thead><tr><th>tenant</th><th>objects</th><th>bytes</th><th>with replicas</th></tr>
      </thead><tbody id="tenants"></tbody></table>
  </section>
</main>
<script>
"use strict";
const WINDOW_S = 300;
const history = [];  // {t, puts, gets, evictions} rates
let last = null;

function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}
function fmtRate(x) { return x >= 100 ? x.toFixed(0) : x.toFixed(1); }
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}
function sumOps(map, pred) {
  let n = 0;
  for (const [op, v] of Object.entries(map || {})) if (pred(op)) n += v;
  return n;
}
const isPut = op => /^(batch_)?(put_start|upsert_start|put_commit)$/.test(op);
const isGet = op => /^(batch_)?(get_replica_list|get_locations)$/.test(op);
function bar(svg, used, cap) {
  const ns = "http://www.w3.org/2000/svg";
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const frac = cap ? Math.min(1, used / cap) : 0;
  const free = document.createElementNS(ns, "rect");
  free.setAttribute("width", "100%"); free.setAttribute("height", "100%");
  free.setAttribute("fill", "#dfe6f1");
  const u = document.createElementNS(ns, "rect");
  u.setAttribute("width", (frac * 100).toFixed(2) + "%"); u.setAttribute("height", "100%");
  u.setAttribute("fill", frac > 0.9 ? "#d64545" : "#2f6fde");
  u.setAttribute("class", "used");
  svg.appendChild(free); svg.appendChild(u);
}
function renderSegments(segs) {
  const body = document.getElementById("segments");
  body.replaceChildren();
  for (const s of segs) {
    const tr = el("tr", undefined, "segment");
    tr.dataset.name = s.name;
    tr.appendChild(el("td", s.name));
    tr.appendChild(el("td", s.state, "state-" + s.state));
    const td = el("td");
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("width", "140"); svg.setAttribute("height", "12");
    bar(svg, s.used, s.capacity);
    td.appendChild(svg);
    tr.appendChild(td);
    tr.appendChild(el("td", fmtBytes(s.used), "num used"));
    tr.appendChild(el("td", fmtBytes(s.capacity), "num"));
    tr.appendChild(el("td", String(s.objects), "num objects"));
    body.appendChild(tr);
  }
}
function renderClients(clients) {
  const body = document.getElementById("clients");
  body.replaceChildren();
  for (const c of clients) {
    const tr = el("tr", undefined, "client");
    tr.appendChild(el("td", c.client_id.slice(0, 12) + (c.silent ? " (silent)" : "")));
    tr.appendChild(el("td", c.host_id.slice(0, 12)));
    tr.appendChild(el("td", String(c.segments), "num"));
    tr.appendChild(el("td", String(c.in_flight_puts), "num"));
    tr.appendChild(el("td", c.ttl_left_s.toFixed(1) + " s", "num"));
    body.appendChild(tr);
  }
}
function renderReclaim(r) {
  const body = document.getElementById("reclaim");
  body.replaceChildren();
  const rows = [["evicted objects", r.evicted], ["evicted bytes", r.evicted_bytes],
    ["active records", r.active_records], ["inactive records", r.inactive_records],
    ["kswapd steps", r.kswapd_steps], ["direct reclaims", r.direct_calls],
    ["swap-outs moved", r.swap_outs_moved], ["soft pins", r.soft_pins]];
  for (const [k, v] of rows) {
    if (v === undefined) continue;
    const tr = el("tr");
    tr.appendChild(el("td", k));
    tr.appendChild(el("td", k.includes("bytes") ? fmtBytes(v) : String(v), "num"));
    body.appendChild(tr);
  }
  if (!body.firstChild) body.appendChild(el("tr")).appendChild(el("td", "reclaim is off"));
}
function drawChart() {
  const c = document.getElementById("ops-chart");
  if (c.clientWidth && c.width !== c.clientWidth) c.width = c.clientWidth;  // crisp, not scaled
  const w = c.width, h = c.height, ctx = c.getContext("2d");
  ctx.clearRect(0, 0, w, h);
  ctx.strokeStyle = "#eee";
  for (let i = 1; i < 4; i++) {
    ctx.beginPath(); ctx.moveTo(0, h * i / 4); ctx.lineTo(w, h * i / 4); ctx.stroke();
  }
  if (history.length < 2) return;
  const now = history[history.length - 1].t;
  let max = 1;
  for (const p of history) max = Math.max(max, p.puts, p.gets, p.evictions);
  const series = [["puts", "#2f6fde"], ["gets", "#1f9d55"], ["evictions", "#d9822b"]];
  for (const [key, color] of series) {
    ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.beginPath();
    history.forEach((p, i) => {
      const x = w - (now - p.t) / WINDOW_S * w, y = h - 4 - p[key] / max * (h - 20);
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
  }
  ctx.fillStyle = "#667"; ctx.font = "12px sans-serif";
  ctx.fillText(fmtRate(max) + "/s", 4, 14);
}
const TOKEN_KEY = "kvpool-admin-token";
let token = sessionStorage.getItem(TOKEN_KEY) || "";
{
  const m = /(?:^#|&)token=([^&]*)/.exec(location.hash);
  if (m) {
    token = decodeURIComponent(m[1]);
    sessionStorage.setItem(TOKEN_KEY, token);
    window.history.replaceState(null, "", location.pathname + location.search);
  }
}
document.getElementById("auth").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = document.getElementById("token").value.trim();
  sessionStorage.setItem(TOKEN_KEY, token);
  document.getElementById("auth").classList.remove("shown");
  tick(); tenants();
});
async function getJSON(path) {
  const headers = token ? {Authorization: "Bearer " + token} : {};
  const r = await fetch(path, {cache: "no-store", headers});
  if (r.status === 401 || r.status === 403) {
    document.getElementById("auth").classList.add("shown");
    throw new Error("an admin token is needed");
  }
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}
async function tick() {
  const status = document.getElementById("status");
  try {
    const s = await getJSON("/api/v1/stats");
    const t = performance.now() / 1000;
    document.getElementById("objects").textContent = String(s.objects);
    document.getElementById("used").textContent = fmtBytes(s.used);
    document.getElementById("capacity").textContent = fmtBytes(s.capacity);
    document.getElementById("role").textContent = "role: " + s.role;
    document.getElementById("uptime").textContent = "up " + Math.round(s.uptime_s) + " s";
    bar(document.getElementById("pool-bar"), s.used, s.capacity);
    renderSegments(s.segments);
    renderClients(s.clients);
    renderReclaim(s.reclaim || {});
    const cur = {
      t, all: sumOps(s.requests, () => true), puts: sumOps(s.requests, isPut),
      gets: sumOps(s.requests, isGet), misses: sumOps(s.failures, isGet),
      evicted: (s.reclaim || {}).evicted || 0,
    };
    if (last !== null && t > last.t) {
      const dt = t - last.t;
      const gets = cur.gets - last.gets, misses = cur.misses - last.misses;
      const p = {t, puts: (cur.puts - last.puts) / dt, gets: gets / dt,
                 evictions: (cur.evicted - last.evicted) / dt};
      history.push(p);
      while (history.length && t - history[0].t > WINDOW_S) history.shift();
      document.getElementById("ops-now").textContent = fmtRate((cur.all - last.all) / dt);
      document.getElementById("evictions-now").textContent = fmtRate(p.evictions);
      if (gets > 0) {
        document.getElementById("hit-ratio").textContent =
          (100 * (gets - misses) / gets).toFixed(1) + "%";
      }
    }
    last = cur;
    drawChart();
    status.textContent = "live"; status.className = "muted";
  } catch (err) {
    status.textContent = "master unreachable (" + err.message + ")"; status.className = "error";
  }
}
async function tenants() {
  try {
    const data = await getJSON("/api/v1/tenants");
    const body = document.getElementById("tenants");
    body.replaceChildren();
    for (const tn of data.tenants.slice(0, 10)) {
      const tr = el("tr", undefined, "tenant");
      tr.appendChild(el("td", tn.tenant));
      tr.appendChild(el("td", String(tn.objects), "num"));
      tr.appendChild(el("td", fmtBytes(tn.bytes), "num"));
      tr.appendChild(el("td", fmtBytes(tn.replica_bytes), "num"));
      body.appendChild(tr);
    }
  } catch (err) { /* shown by the stats poll */ }
}
tick(); tenants();
setInterval(tick, 1000);
setInterval(tenants, 10000);
</script>
</body>
</html>
"""
