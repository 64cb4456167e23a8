// fulcrum's web console: reads /status and /history from the admin
// listener it was served by, and posts the same requests `fulcrum set` and
// `fulcrum drain` send. No external assets; everything is drawn here.
"use strict";

const $ = (id) => document.getElementById(id);
let hist = { times: [], series: {} };
let pending = null; // the action awaiting confirmation

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// short formats seconds as fulcrum status does: 45s, 3m12s, 2h5m, 3d4h.
function short(sec) {
  sec = Math.max(0, Math.round(sec));
  if (sec < 60) return sec + "s";
  if (sec < 3600) return Math.floor(sec / 60) + "m" + (sec % 60) + "s";
  if (sec < 86400) return Math.floor(sec / 3600) + "h" + Math.floor((sec % 3600) / 60) + "m";
  return Math.floor(sec / 86400) + "d" + Math.floor((sec % 86400) / 3600) + "h";
}

function latency(ms) {
  if (ms < 1) return Math.round(ms * 1000) + "µs";
  if (ms < 1000) return ms.toFixed(1) + "ms";
  return (ms / 1000).toFixed(2) + "s";
}

function bytes(n) {
  if (n < 1024) return n + " B";
  const u = "KMGTPE";
  let i = -1;
  do { n /= 1024; i++; } while (n >= 1024 && i < u.length - 1);
  return n.toFixed(1) + " " + u[i] + "iB";
}

function ago(t, now) {
  if (!t) return "";
  return short((now - Date.parse(t)) / 1000);
}

function clock(t) {
  const d = new Date(t);
  return d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
}

// spark draws values (null where unknown) as a small polyline.
function spark(values, cls, label) {
  const w = 90, h = 22;
  const vs = (values || []).slice(-120);
  const known = vs.filter((v) => v !== null);
  if (known.length === 0) return `<svg class="spark" viewBox="0 0 ${w} ${h}" aria-label="${label}: no data"></svg>`;
  const max = Math.max(...known, cls === "latency" ? 0.001 : 1);
  const pts = [];
  vs.forEach((v, i) => {
    if (v === null) return;
    const x = vs.length === 1 ? w : (i * w) / (vs.length - 1);
    pts.push(x.toFixed(1) + "," + (h - 1 - (v / max) * (h - 2)).toFixed(1));
  });
  const last = known[known.length - 1];
  return `<svg class="spark" viewBox="0 0 ${w} ${h}" role="img" aria-label="${label}: last ${last}, max ${max}"><title>${label}: last ${+last.toFixed(2)}, max ${+max.toFixed(2)}</title><polyline class="${cls}" points="${pts.join(" ")}"/></svg>`;
}

function stateClass(s) { return "s-" + String(s).replace(/ /g, "-"); }

function servingBanner(s, now) {
  const since = s.serving_since ? ` since ${clock(s.serving_since)} (${ago(s.serving_since, now)})` : "";
  switch (s.serving) {
    case "fallback": return `<div class="banner fallback" data-serving="fallback">On its fallback: new connections go to ${esc(s.fallback)}${since}</div>`;
    case "holding": return `<div class="banner holding" data-serving="holding">HOLDING: no eligible backend; new connections wait (hold_timeout)${since}</div>`;
    case "refusing": return `<div class="banner refusing" data-serving="refusing">REFUSING: no eligible backend; new connections are closed${since}</div>`;
  }
  return "";
}

function actions(svc, b) {
  if (b.removed) return "";
  const cur = b.override || "ready";
  return `<div class="actions">` + ["drain", "maint", "ready"].filter((a) => a !== cur)
    .map((a) => `<button type="button" data-action="set" data-service="${esc(svc)}" data-backend="${esc(b.name)}" data-state="${a}">${a}</button>`).join("") + `</div>`;
}

function backendRow(s, b, now) {
  const key = s.name + "/" + b.name;
  const hs = hist.series[key] || {};
  const rates = (hs.rate || []).filter((v) => v !== null);
  const rate = rates.length ? rates[rates.length - 1] : null;
  const weight = b.removed ? "-" : (b.weight === b.configured_weight ? `${b.weight}` : `${b.weight}/${b.configured_weight}`);
  // where the effective weight comes from
  let wsrc = "file";
  if (b.removed) wsrc = "removed";
  else if (b.override) wsrc = "set " + b.override;
  else if (b.state !== "up") wsrc = b.cause || b.state;
  else if (b.weight < b.configured_weight) wsrc = "slow start";
  const notes = [b.cause && !b.state.includes(b.cause) ? b.cause : "", b.backup ? "backup" : ""].filter(Boolean).join(", ");
  let role = esc(b.role || "");
  if (b.lag_seconds !== undefined && b.lag_seconds !== null) role += ` <span class="sub">lag ${latency(b.lag_seconds * 1000)}</span>`;
  let check = "";
  if (b.last_check) {
    const c = b.last_check;
    check = `<span class="check ${c.ok ? "ok" : "bad"}">${c.ok ? "ok" : "failed"} ${latency(c.latency_ms)}, ${ago(c.at, now)} ago</span>` +
      (c.error ? `<span class="sub">${esc(c.error)}</span>` : "");
  }
  const reason = b.reason ? `<span class="sub">${esc(b.reason)}</span>` : "";
  const limit = b.max_conns ? ` / ${b.max_conns}` : "";
  return `<tr data-backend="${esc(key)}" data-state="${esc(b.state)}" data-override="${esc(b.override || "ready")}">
<td data-label="backend"><strong>${esc(b.name)}</strong><span class="sub">${esc(b.address)}</span></td>
<td data-label="state"><span class="badge ${b.override ? "s-held" : stateClass(b.state)}">${b.override ? "held: " + esc(b.override) : esc(b.state)}</span>${notes ? ` <small>(${esc(notes)})</small>` : ""}${reason}</td>
<td data-label="in state" class="num">${b.since ? short((now - Date.parse(b.since)) / 1000) : "since start"}</td>
<td data-label="weight" class="num" title="effective/configured">${weight}<span class="sub">${esc(wsrc)}</span></td>
<td data-label="role">${role}</td>
<td data-label="conns" class="num">${b.active}${limit}<span class="sub">${b.total} total</span></td>
<td data-label="new/s" class="num">${rate === null ? "-" : rate.toFixed(1)}</td>
<td data-label="bytes" class="num">${bytes(b.bytes_in)} in<span class="sub">${bytes(b.bytes_out)} out</span></td>
<td data-label="changes" class="num">${b.transitions}${b.downtime_seconds > 0 ? `<span class="sub">down ${short(b.downtime_seconds)}</span>` : ""}</td>
<td data-label="last check">${check || "-"}</td>
<td data-label="last minutes"><div class="plots"><span>conns</span>${spark(hs.conns, "conns", "connections")}<span>new/s</span>${spark(hs.rate, "rate", "new connections per second")}<span>check</span>${spark(hs.latency_ms, "latency", "check latency ms")}</div></td>
<td data-label="actions">${actions(s.name, b)}</td>
</tr>`;
}

function serviceCard(s, now) {
  const unserved = Object.entries(s.unserved || {}).map(([k, v]) => `${esc(k)} ${v}`).join(", ");
  const alert = s.serving === "refusing" || s.serving === "holding" || (s.split_brain || []).length > 0;
  const cls = "service" + (alert ? " alert" : "") + (s.serving === "fallback" ? " fallback" : "");
  const split = (s.split_brain || []).length ? `<div class="banner split">SPLIT BRAIN: ${esc(s.split_brain.join(", "))} claim primary</div>` : "";
  return `<article class="${cls}" data-service="${esc(s.name)}" data-serving="${esc(s.serving || "")}">
<div class="head"><h2>${esc(s.name)}</h2>
<span class="facts">${esc(s.scheduler || "removed")} · ${esc((s.listen || []).join(" "))} · active <span data-active>${s.active}${s.max_conns ? " / " + s.max_conns : ""}</span> · waiting ${s.waiting} · holding ${s.holding} · held ${s.held} (expired ${s.hold_expired}) · retries ${s.retries} · refused ${s.refused}${unserved ? " · ended without a backend: " + unserved : ""}${s.fallbacks ? " · fallbacks " + s.fallbacks : ""}</span></div>
${split}${servingBanner(s, now)}${s.hint ? `<div class="banner holding" data-hint>${esc(s.hint)}</div>` : ""}
<div class="tablewrap"><table><thead><tr><th>backend</th><th>state</th><th>in state</th><th>weight</th><th>role</th><th>conns</th><th>new/s</th><th>bytes</th><th>changes</th><th>last check</th><th>last minutes</th><th></th></tr></thead>
<tbody>${(s.backends || []).map((b) => backendRow(s, b, now)).join("")}</tbody></table></div>
</article>`;
}

function render(st) {
  const now = Date.now();
  $("version").textContent = st.version || "";
  const svcs = st.services || [];
  let up = 0, total = 0, open = 0;
  svcs.forEach((s) => (s.backends || []).forEach((b) => { open += b.active; if (!b.removed) { total++; if (b.state === "up") up++; } }));
  let sum = `generation ${st.generation} · ${svcs.length} services · backends ${up}/${total} up · ${open} connections`;
  if (st.reload && st.reload.last_error) sum += " · last reload refused: " + st.reload.last_error;
  $("summary").textContent = sum;
  const inst = st.instance;
  const ib = $("instance");
  if (inst) {
    ib.textContent = (inst.draining ? "drained" : inst.healthy ? "healthy" : "unhealthy") + ": " + inst.reason;
    ib.className = "badge " + (inst.healthy ? "ok" : "bad");
    ib.dataset.draining = inst.draining ? "true" : "false";
    $("drain-instance").hidden = inst.draining;
    $("undrain-instance").hidden = !inst.draining || inst.stopping;
  } else {
    ib.textContent = "no instance state";
    $("drain-instance").hidden = $("undrain-instance").hidden = true;
  }
  $("services").innerHTML = svcs.map((s) => serviceCard(s, now)).join("");
  const ev = (st.events || []).slice(-100).reverse();
  $("events").innerHTML = ev.length ? ev.map((e) => `<li data-seq="${e.seq}"><time datetime="${esc(e.at)}" title="${esc(e.at)}">${clock(e.at)}</time><span>${e.service ? esc(e.service) : "(reload)"}${e.backend ? "/" + esc(e.backend) : ""}</span><span><strong>${esc(e.from)} → ${esc(e.to)}</strong> <span class="why">${esc(e.reason)}</span></span></li>`).join("")
    : `<li><span>no state changes since start</span></li>`;
  $("updated").textContent = "updated " + new Date(now).toLocaleTimeString([], { hour12: false });
}

async function refresh() {
  try {
    const r = await fetch("/status", { cache: "no-store" });
    if (!r.ok) throw new Error("/status: " + r.status + " " + (await r.text()));
    render(await r.json());
    $("error").hidden = true;
  } catch (e) {
    $("error").textContent = "cannot read /status: " + e.message;
    $("error").hidden = false;
  }
}

async function refreshHistory() {
  try {
    const r = await fetch("/history", { cache: "no-store" });
    if (r.ok) hist = await r.json();
  } catch (e) { /* the next round tries again; /status says what is wrong */ }
}

function toast(text) {
  const t = $("toast");
  t.textContent = text;
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, 6000);
}

const words = {
  drain: "New connections stop; open sessions run on.",
  maint: "New connections stop, and it is not counted up whatever its checks say; open sessions run on.",
  ready: "The file and the checks decide again.",
};

function ask(a) {
  let text;
  if (a.action === "set") {
    text = `Set ${a.service}/${a.backend} to ${a.state}? ${words[a.state]}`;
  } else if (a.action === "instance-drain") {
    text = "Drain this instance? /healthz fails, so load balancers in front move traffic away; connections are still served.";
  } else {
    text = "Undrain this instance? /healthz answers 200 again.";
  }
  pending = a;
  $("confirm-text").textContent = text;
  $("confirm").hidden = false;
  $("confirm-yes").focus();
}

async function act(a) {
  let path;
  if (a.action === "set") path = `/backends/${encodeURIComponent(a.service)}/${encodeURIComponent(a.backend)}/${a.state}`;
  else path = a.action === "instance-drain" ? "/drain" : "/undrain";
  try {
    const r = await fetch(path, { method: "POST", headers: { "X-Fulcrum-Console": "1" } });
    toast((r.ok ? "" : r.status + ": ") + (await r.text()).trim());
  } catch (e) {
    toast("failed: " + e.message);
  }
  refresh();
}

document.addEventListener("click", (ev) => {
  const b = ev.target.closest("button");
  if (!b) return;
  if (b.id === "confirm-no") { pending = null; $("confirm").hidden = true; return; }
  if (b.id === "confirm-yes") { const a = pending; pending = null; $("confirm").hidden = true; if (a) act(a); return; }
  if (b.dataset.action) ask({ action: b.dataset.action, service: b.dataset.service, backend: b.dataset.backend, state: b.dataset.state });
});
document.addEventListener("keydown", (ev) => { if (ev.key === "Escape") { pending = null; $("confirm").hidden = true; } });

async function loop() {
  await refresh();
  setTimeout(loop, 1000);
}
async function histLoop() {
  await refreshHistory();
  setTimeout(histLoop, 2000);
}
histLoop();
loop();
