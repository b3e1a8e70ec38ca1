/* The target's dashboard: polls GET /api/dashboard every second and redraws itself.
   Every string from the node (peer ids, errors, reasons) is attacker-controlled: it is only ever
   put into the page as textContent or an attribute value, never parsed as HTML. */
(function () {
  "use strict";

  const ENDPOINT = "/api/dashboard";
  const POLL_MS = 1000;
  const TIMEOUT_MS = 4000;
  const MAX_SAMPLES = 180; // points of the time series (about three minutes)
  const SVG_NS = "http://www.w3.org/2000/svg";
  const WEI_PER_ETH = 1e18;

  const $ = (id) => document.getElementById(id);
  const isNum = (x) => typeof x === "number" && Number.isFinite(x);
  const samples = [];

  // ---- formatting -------------------------------------------------------------------------
  function fmtInt(x) {
    return isNum(x) ? Math.round(x).toLocaleString("en-US") : "–";
  }

  function fmtFixed(x, digits) {
    return isNum(x) ? x.toFixed(digits) : "–";
  }

  function fmtPct(x) {
    return isNum(x) ? (100 * x).toFixed(1) + " %" : "–";
  }

  function fmtDuration(seconds) {
    if (!isNum(seconds)) return "–";
    const s = Math.max(0, Math.round(seconds));
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
    return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
  }

  function fmtEth(wei) {
    if (!isNum(wei)) return "–";
    const eth = wei / WEI_PER_ETH;
    const text = eth === 0 ? "0" : Math.abs(eth) >= 0.001 ? String(+eth.toFixed(6)) : eth.toExponential(3);
    return text + " ETH";
  }

  function fmtClock(unix) {
    if (!isNum(unix) || unix <= 0) return "–";
    return new Date(unix * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  }

  function shortId(id) {
    const s = String(id);
    return s.length > 18 ? s.slice(0, 8) + "…" + s.slice(-6) : s;
  }

  // ---- DOM helpers: text only ---------------------------------------------------------------
  function el(tag, text, attrs) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    return node;
  }

  function setValue(id, text, raw) {
    const node = $(id);
    node.textContent = text;
    if (raw === undefined || raw === null) node.removeAttribute("data-value");
    else node.setAttribute("data-value", String(raw));
  }

  function tag(text, kind) {
    return el("span", text, { class: "tag" + (kind ? " " + kind : "") });
  }

  function cell(field, text, attrs) {
    return el("td", text, Object.assign({ "data-field": field }, attrs || {}));
  }

  function emptyRow(columns, text) {
    const tr = el("tr");
    tr.appendChild(el("td", text, { class: "empty", colspan: columns }));
    return tr;
  }

  // ---- sections -------------------------------------------------------------------------------
  function renderHeader(d) {
    const ok = d.status === "ok";
    const badge = $("status");
    badge.textContent = ok ? "ok" : "unavailable";
    badge.setAttribute("data-status", ok ? "ok" : "unavailable");
    const reason = $("reason");
    reason.hidden = ok;
    reason.textContent = ok ? "" : String(d.reason || "no reason given");
    $("model").textContent = d.model == null ? "–" : String(d.model);
    $("peer-id").textContent = d.peer_id == null ? "(no libp2p host yet)" : String(d.peer_id);
    $("uptime").textContent = fmtDuration(d.uptime_s);
    const addrs = Array.isArray(d.multiaddrs) ? d.multiaddrs : [];
    $("multiaddrs").replaceChildren(...addrs.map((a) => el("li", a)));
  }

  function renderCounters(c) {
    const fields = {
      requests: "requests",
      "requests-failed": "requests_failed",
      "requests-refused": "requests_refused",
      "active-jobs": "active_jobs",
      "tokens-generated": "tokens_generated",
      "target-passes": "target_passes",
      "draft-proposed": "draft_tokens_proposed",
      "draft-accepted": "draft_tokens_accepted",
    };
    for (const [id, key] of Object.entries(fields)) {
      setValue(id, fmtInt(c[key]), isNum(c[key]) ? c[key] : null);
    }
    const prop = c.draft_tokens_proposed;
    const acc = prop > 0 ? c.draft_tokens_accepted / prop : null;
    setValue("acceptance", fmtPct(acc), acc);
    const perPass = c.target_passes > 0 ? c.tokens_generated / c.target_passes : null;
    setValue("tokens-per-pass", fmtFixed(perPass, 2), perPass);
  }

  function drafterState(d) {
    if (d.benched) {
      const why = d.bench_reason ? ": " + d.bench_reason : "";
      return tag("benched for " + fmtDuration(d.bench_remaining_s) + why, "bad");
    }
    if (d.busy) return tag("busy");
    return tag("ready", "good");
  }

  function drafterRow(peer, d) {
    const tr = el("tr", null, { "data-peer": peer, "data-benched": d.benched ? "true" : "false" });
    const latency = isNum(d.latency_ms) ? d.latency_ms.toFixed(1) + " ms" : "–";
    const state = cell("state", null, { class: "text" });
    state.appendChild(drafterState(d));
    tr.append(
      cell("peer", shortId(peer), { title: peer, class: "mono" }),
      cell("proposed", fmtInt(d.proposed)),
      cell("matched", fmtInt(d.matched)),
      cell("credited_tokens", fmtInt(d.credited_tokens)),
      cell("match_rate", fmtPct(d.match_rate)),
      cell("late", fmtInt(d.late)),
      cell("timeouts", fmtInt(d.timeouts)),
      cell("errors", fmtInt(d.errors)),
      cell("refusals", fmtInt(d.refusals)),
      cell("latency_ms", latency),
      cell("jobs", fmtInt(d.jobs)),
      state,
      cell("last_error", d.last_error ? String(d.last_error) : "", { class: "text" }),
    );
    return tr;
  }

  function renderDrafters(drafters, total) {
    const entries = drafters && typeof drafters === "object" ? Object.entries(drafters) : [];
    const rows = entries.map(([peer, d]) => drafterRow(peer, d || {}));
    const body = $("drafters").tBodies[0];
    body.replaceChildren(...(rows.length ? rows : [emptyRow(13, "no drafter has registered")]));
    const shown = isNum(total) && total > entries.length ? entries.length + " of " + total : String(entries.length);
    $("drafters-count").textContent = "(" + shown + ")";
  }

  function jobRow(j) {
    const tr = el("tr", null, { "data-job": j.job, "data-speculative": j.speculative ? "true" : "false" });
    const mode = cell("mode", null, { class: "text" });
    mode.appendChild(tag(j.speculative ? "speculative" : "plain", j.speculative ? "good" : ""));
    if (j.replayed) mode.append(" ", tag("replayed"));
    const wait = isNum(j.draft_wait_ms_per_round) ? j.draft_wait_ms_per_round.toFixed(1) + " ms" : "–";
    tr.append(
      cell("finished_at", fmtClock(j.finished_at).slice(11)),
      cell("tokens", fmtInt(j.tokens)),
      cell("acceptance_rate", fmtPct(j.acceptance_rate)),
      cell("mean_accepted_length", fmtFixed(j.mean_accepted_length, 2)),
      cell("tokens_per_second", fmtFixed(j.tokens_per_second, 1)),
      cell("draft_wait_ms_per_round", wait),
      mode,
      cell("job", shortId(j.job), { title: String(j.job), class: "mono" }),
    );
    return tr;
  }

  function renderJobs(jobs) {
    const list = Array.isArray(jobs) ? jobs : [];
    const rows = list.map((j) => jobRow(j || {}));
    $("jobs").tBodies[0].replaceChildren(...(rows.length ? rows : [emptyRow(8, "no job has finished yet")]));
  }

  function yesNo(value, yes, no) {
    return value ? tag(yes, "good") : tag(no, "bad");
  }

  function challengeRow(ch) {
    const tr = el("tr", null, { "data-challenge": ch.id, "data-state": ch.state });
    tr.append(
      cell("id", fmtInt(ch.id)),
      cell("state", String(ch.state || "–")),
      cell("position", fmtInt(ch.position)),
      cell("challenger", shortId(ch.challenger || "–"), { title: String(ch.challenger || ""), class: "mono" }),
      cell("bond_wei", fmtEth(ch.bond_wei)),
      cell("opened_at", fmtClock(ch.opened_at)),
      cell("deadline", fmtClock(ch.deadline)),
    );
    return tr;
  }

  function renderOperator(op) {
    const card = $("operator");
    card.hidden = !op;
    if (!op) return;
    $("op-address").textContent = String(op.address || "–");
    $("op-contract").textContent = String(op.contract || "–");
    $("op-chain").textContent = fmtInt(op.chain_id);
    setValue("op-bond", fmtEth(op.bond_wei), op.bond_wei);
    const state = op.unbonding ? "unbonding (free at " + fmtClock(op.unbond_at) + ")" : op.active ? "active" : "inactive";
    $("op-state").replaceChildren(tag(state, op.active && !op.unbonding ? "good" : "bad"));
    $("op-chain-reachable").replaceChildren(yesNo(op.chain_reachable, "yes", "no"));
    const serving = $("op-serving");
    serving.replaceChildren(yesNo(op.serving, "serving", "not serving"));
    if (!op.serving && op.reason) serving.append(" ", String(op.reason));
    $("op-receipts").textContent = fmtInt(op.receipts_signed);
    renderEscrow(op.payments);
    const list = Array.isArray(op.challenges) ? op.challenges : [];
    const rows = list.map((ch) => challengeRow(ch || {}));
    $("challenges").tBodies[0].replaceChildren(...(rows.length ? rows : [emptyRow(7, "no challenge")]));
  }

  // drafters are paid from the operator's DrafterEscrow, never the bond (docs/market.md)
  function renderEscrow(pay) {
    const cell = $("op-escrow");
    if (!pay) {
      cell.textContent = "drafters unpaid";
      return;
    }
    if (pay.balance_wei === undefined) {
      cell.textContent = "not read yet";
      return;
    }
    const price = fmtInt(pay.price_wei) + " wei per accepted token";
    cell.replaceChildren(fmtEth(pay.balance_wei) + ", " + price + " ", tag(pay.low ? "low" : "ok", pay.low ? "bad" : "good"));
  }

  // ---- time series, from successive polls ---------------------------------------------------
  function addSample(d) {
    const c = d.counters;
    const s = {
      t: d.now,
      uptime: d.uptime_s,
      tokens: c.tokens_generated,
      proposed: c.draft_tokens_proposed,
      accepted: c.draft_tokens_accepted,
    };
    if (![s.t, s.tokens, s.proposed, s.accepted].every(isNum)) return;
    const last = samples[samples.length - 1];
    if (last && (s.uptime < last.uptime || s.tokens < last.tokens || s.proposed < last.proposed)) {
      samples.length = 0; // the node restarted: its counters began again
    } else if (last && s.t <= last.t) {
      return;
    }
    samples.push(s);
    if (samples.length > MAX_SAMPLES + 1) samples.shift();
  }

  function seriesPoints() {
    const tps = [];
    const acc = [];
    for (let i = 1; i < samples.length; i++) {
      const a = samples[i - 1];
      const b = samples[i];
      const dt = b.t - a.t;
      tps.push(dt > 0 ? (b.tokens - a.tokens) / dt : null);
      const dp = b.proposed - a.proposed;
      acc.push(dp > 0 ? (b.accepted - a.accepted) / dp : null);
    }
    return { tps, acc };
  }

  function svgEl(tagName, attrs) {
    const node = document.createElementNS(SVG_NS, tagName);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    return node;
  }

  function drawSeries(svg, values, maxValue, color, format) {
    const W = 400;
    const H = 120;
    const left = 34;
    const top = 8;
    const bottom = H - 16;
    const n = MAX_SAMPLES;
    const x = (i) => left + ((W - left - 4) * (n - values.length + i)) / (n - 1);
    const y = (v) => bottom - ((bottom - top) * Math.min(v, maxValue)) / maxValue;
    const parts = [];
    let pen = false;
    values.forEach((v, i) => {
      if (v === null) {
        pen = false;
        return;
      }
      parts.push((pen ? "L" : "M") + x(i).toFixed(1) + " " + y(v).toFixed(1));
      pen = true;
    });
    const label = (text, ty) => {
      const t = svgEl("text", { x: left - 4, y: ty, "text-anchor": "end" });
      t.textContent = text;
      return t;
    };
    const points = values.filter((v) => v !== null).length;
    const alone = (i) => values[i] !== null && (i === 0 || values[i - 1] === null) && values[i + 1] == null;
    const dots = values
      .map((v, i) => (alone(i) ? svgEl("circle", { cx: x(i), cy: y(v), r: 2.5, fill: color }) : null))
      .filter((dot) => dot !== null);
    svg.setAttribute("data-points", String(points));
    svg.replaceChildren(
      ...dots,
      svgEl("line", { class: "axis", x1: left, y1: top, x2: W - 4, y2: top, "stroke-dasharray": "2 3" }),
      svgEl("line", { class: "axis", x1: left, y1: bottom, x2: W - 4, y2: bottom }),
      label(format(maxValue), top + 4),
      label("0", bottom + 4),
      svgEl("path", { d: parts.join(" ") || "M0 0", fill: "none", stroke: color, "stroke-width": 2 }),
    );
    const t = svgEl("text", { x: W - 4, y: H - 2, "text-anchor": "end" });
    t.textContent = points ? "last " + fmtDuration((samples[samples.length - 1].t - samples[0].t) || 0) : "waiting for data";
    svg.appendChild(t);
  }

  function renderSeries() {
    const { tps, acc } = seriesPoints();
    const peak = Math.max(1, ...tps.filter(isNum));
    const niceMax = Math.pow(10, Math.ceil(Math.log10(peak)));
    const top = [0.2, 0.5, 1].map((f) => f * niceMax).find((m) => m >= peak) || niceMax;
    drawSeries($("series-tps"), tps, top, "#2f6fdf", (v) => String(+v.toPrecision(3)));
    drawSeries($("series-acc"), acc, 1, "#d9822b", (v) => Math.round(100 * v) + "%");
    const lastTps = tps.length ? tps[tps.length - 1] : null;
    const lastAcc = acc.filter((v) => v !== null).pop();
    $("series-tps-now").textContent = isNum(lastTps) ? lastTps.toFixed(1) : "–";
    $("series-acc-now").textContent = isNum(lastAcc) ? fmtPct(lastAcc) : "–";
  }

  // ---- polling ---------------------------------------------------------------------------
  function render(d) {
    if (!d || typeof d !== "object" || !d.counters || typeof d.counters !== "object") {
      throw new Error("unexpected answer from " + ENDPOINT);
    }
    renderHeader(d);
    renderCounters(d.counters);
    addSample(d);
    renderSeries();
    renderDrafters(d.drafters, d.drafters_total);
    renderJobs(d.jobs);
    renderOperator(d.operator);
  }

  function setConnection(state, text, detail) {
    const badge = $("conn");
    badge.setAttribute("data-state", state);
    badge.textContent = text;
    badge.title = detail || "";
    document.body.setAttribute("data-conn", state);
  }

  async function fetchDashboard() {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), TIMEOUT_MS);
    try {
      const resp = await fetch(ENDPOINT, { cache: "no-store", signal: abort.signal, headers: { Accept: "application/json" } });
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      return await resp.json();
    } finally {
      clearTimeout(timer);
    }
  }

  let polls = 0;

  async function poll() {
    let data;
    try {
      data = await fetchDashboard();
    } catch (err) {
      const why = err && err.name === "AbortError" ? "no answer within " + TIMEOUT_MS / 1000 + " s" : String(err);
      setConnection("unreachable", "node unreachable", why);
      setTimeout(poll, POLL_MS);
      return;
    }
    try {
      render(data);
      polls += 1;
      document.body.setAttribute("data-polls", String(polls));
      setConnection("live", "live · " + fmtClock(data.now).slice(11, 19), "");
    } catch (err) {
      console.error("dashboard: cannot show the answer of " + ENDPOINT, err);
      setConnection("unreachable", "unexpected answer", String(err));
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  window.SpecDashboard = Object.freeze({ shortId, fmtEth, fmtDuration, samples });
  poll();
})();
