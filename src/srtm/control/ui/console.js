// The SRTM console: polls GET /ui/state and renders it. Plain JS, no build step.
"use strict";

const POLL_MS = 1500;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function num(x, digits = 0) {
  if (x === null || x === undefined) return "—";
  return Number(x).toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

function ms(x) {
  if (x === null || x === undefined) return "—";
  return x < 10 ? `${num(x, 3)} ms` : `${num(x, 1)} ms`;
}

function ledgerBar(b) {
  const scale = Math.max(b.mcap, b.allocated, b.measured) || 1;
  const bar = el("div", { class: b.over ? "bar over" : "bar",
    title: `allocated ${num(b.allocated)} · measured ${num(b.measured)} of mcap ${num(b.mcap)} msg/s` });
  bar.append(el("div", { class: "alloc", style: `width:${(100 * b.allocated / scale).toFixed(1)}%` }));
  bar.append(el("div", { class: "meas", style: `width:${(100 * b.measured / scale).toFixed(1)}%` }));
  return bar;
}

function renderBrokers(brokers) {
  const body = document.querySelector("#brokers tbody");
  // Grouped by host (the processes of one `srtm node` together), in the ledger's order
  // within a host; a broker on a host of its own is labelled by its address only.
  const hosts = [...new Set(brokers.map((b) => b.host))];
  const rows = hosts.flatMap((h) => brokers.filter((b) => b.host === h));
  body.replaceChildren(...rows.map((b) => el("tr", { "data-broker": b.id, "data-host": b.host },
    el("td", {}, b.id, el("div", { class: "note" },
      b.host === b.id ? b.tcp_address : `host ${b.host} · ${b.tcp_address}`)),
    el("td", { class: b.down ? "down" : "up" }, b.down ? "down" : "up", b.over ? " · over mcap" : ""),
    el("td", { class: "num" }, b.topics),
    el("td", {}, ledgerBar(b)),
    el("td", { class: "num mcap" }, num(b.mcap)),
    el("td", { class: "num allocated" }, num(b.allocated, 1)),
    el("td", { class: "num measured" }, num(b.measured, 1)),
    el("td", { class: "num rcap" }, num(b.rcap, 1)),
  )));
}

function sloMark(t) {
  if (t.slo_met === null) return el("span", { class: "none" }, "no deliveries");
  return t.slo_met ? el("span", { class: "met" }, "✔ met") : el("span", { class: "missed" }, "✘ missed");
}

function share(s) {
  const bucket = s.bucket ? `${num(s.bucket.rate, 1)}/${num(s.bucket.burst, 1)}` : "held";
  const text = `${s.id} · ${s.publishers} pub · ${bucket} · ${num(s.rate, 1)} msg/s · ${ms(s.delivery_p99_ms)}`;
  const cls = ["share", s.draining ? "draining" : "", s.over_envelope ? "over-envelope" : ""];
  return el("div", { class: cls.filter(Boolean).join(" "), "data-broker": s.id },
    s.draining ? `${text} (draining)` : text,
    s.over_envelope ? el("span", { class: "over-envelope" }, " · over its envelope") : "");
}

// A topic sent faster than its envelope: what its brokers measure against its rate, and who.
function envelope(t) {
  if (!t.over_envelope) return "";
  const who = t.senders.length ? ` · sent by ${t.senders.join(", ")}` : "";
  return el("div", { class: "over-envelope" },
    `over its envelope: ${num(t.measured_rate, 1)} msg/s measured, r ${num(t.rate, 1)}${who}`);
}

// Waits for a subscriber, apart from the SLO: the oldest message waiting now, and the
// p99 of the deliveries in the window that had waited for one.
function backlog(t) {
  const waited = t.waits ? `${ms(t.wait_p99_ms)} p99 of ${num(t.waits)} that waited` : "none waited";
  const age = t.backlog_age_ms ? `${ms(t.backlog_age_ms)} oldest` : (t.backlog_age_ms === 0 ? "none waiting" : "—");
  return [age, el("div", { class: "note" }, waited)];
}

function fitting(f) {
  if (!f) return "";
  const where = f.iteration ? ` · iteration ${f.iteration}, round ${f.round}` : "";
  return `fitting ${f.state}${where}`;
}

function renderTopics(topics) {
  const body = document.querySelector("#topics tbody");
  body.replaceChildren(...topics.map((t) => el("tr", { "data-topic": t.name },
    el("td", {}, t.name, el("div", { class: "note" },
      `${t.policy} · v${t.version} · r ${num(t.rate, 1)} · b ${num(t.burst, 1)} · ${t.publishers} publishers`),
      envelope(t)),
    el("td", {}, t.status, t.unassigned ? el("div", { class: "note" }, `${t.unassigned} unassigned`) : ""),
    el("td", { class: "num slo" }, ms(t.slo_p99_ms)),
    el("td", { class: "num p99" }, ms(t.delivery_p99_ms), el("div", { class: "note" }, `${num(t.deliveries)} deliveries`)),
    el("td", { class: "verdict" }, sloMark(t)),
    el("td", { class: "num backlog" }, ...backlog(t)),
    el("td", { class: "plan" }, ...t.brokers.map(share)),
    el("td", { class: "num drl", title: t.drl.note },
      ms(t.drl.penalty_ms), el("div", { class: "note" }, t.drl.note)),
    el("td", {}, t.adaptor, el("div", { class: "note" }, fitting(t.fitting))),
  )));
}

function renderEvents(topics) {
  const items = [];
  for (const t of topics) for (const e of t.events.slice(-8)) items.push(el("li", {}, `${t.name}: ${e}`));
  document.getElementById("events").replaceChildren(...items);
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const resp = await fetch("/ui/state", { cache: "no-store" });
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    const state = await resp.json();
    const i = state.info;
    document.getElementById("info").textContent =
      `version ${i.version} · ticks ${i.ticks} · stalls ${i.stalls} · auth ${i.auth ? "on" : "off"}`;
    // A standby (or a controller with no leader) shows where plan changes are made.
    const leader = document.getElementById("leader");
    leader.textContent = i.leader ? "" : `plan changes ${i.plan_changes}`;
    leader.className = i.leader ? "status" : "status error";
    renderBrokers(state.brokers);
    renderTopics(state.topics);
    renderEvents(state.topics);
    status.textContent = `updated ${new Date().toLocaleTimeString()}`;
    status.className = "status";
    document.body.dataset.loaded = "true";
  } catch (err) {
    status.textContent = `cannot reach the controller: ${err.message}`;
    status.className = "status error";
  }
  setTimeout(poll, POLL_MS);
}

poll();
