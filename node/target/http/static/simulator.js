/* The speculative decoding simulator.

   window.SpecTheory holds the formulas of verifier/theory.py (Leviathan, Kalman & Matias 2023, §3),
   a seeded PRNG, one simulated round, and the parser of measurement files; it needs no DOM, so
   tests run it in Node. The page (when there is a document) draws S(γ) and runs rounds with it. */
(function (root) {
  "use strict";

  const MAX_THEORY_GAMMA = 32;
  const NETWORK_LABEL = "over the network"; // the demo's measured run, as opposed to its local γ sweep
  const isNum = (x) => typeof x === "number" && Number.isFinite(x);

  function check(alpha, gamma) {
    if (!(alpha >= 0 && alpha <= 1)) throw new RangeError("alpha must be in [0, 1], got " + alpha);
    if (!Number.isInteger(gamma) || gamma < 0) throw new RangeError("gamma must be an integer >= 0, got " + gamma);
  }

  /** Ω(α, γ): expected tokens emitted per target pass (theory.expected_tokens). */
  function expectedTokens(alpha, gamma) {
    check(alpha, gamma);
    if (alpha === 1) return gamma + 1;
    return (1 - alpha ** (gamma + 1)) / (1 - alpha);
  }

  /** S(α, γ, c, v) = Ω / (γ·c + v) (theory.speedup). */
  function speedup(alpha, gamma, cost, verifyCost = 1) {
    if (!(cost >= 0) || !(verifyCost > 0)) {
      throw new RangeError("costs must be non-negative (verify > 0), got c=" + cost + ", v=" + verifyCost);
    }
    return expectedTokens(alpha, gamma) / (gamma * cost + verifyCost);
  }

  /** The γ in [1, maxGamma] that maximises S, ties to the smallest (theory.optimal_gamma, which takes v = 1). */
  function optimalGamma(alpha, cost, maxGamma = MAX_THEORY_GAMMA, verifyCost = 1) {
    if (!Number.isInteger(maxGamma) || maxGamma < 1) throw new RangeError("maxGamma must be >= 1, got " + maxGamma);
    let best = 1;
    let bestValue = speedup(alpha, 1, cost, verifyCost);
    for (let g = 2; g <= maxGamma; g++) {
      const value = speedup(alpha, g, cost, verifyCost);
      if (value > bestValue) {
        best = g;
        bestValue = value;
      }
    }
    return best;
  }

  /** [S(1), ..., S(maxGamma)]. */
  function speedupCurve(alpha, cost, verifyCost, maxGamma) {
    const out = [];
    for (let g = 1; g <= maxGamma; g++) out.push(speedup(alpha, g, cost, verifyCost));
    return out;
  }

  /** A seeded uniform generator on [0, 1): Marsaglia's xorshift32 on a scrambled seed. */
  function makeRng(seed) {
    let x = (Math.imul((seed >>> 0) ^ 0x5bd1e995, 0x9e3779b1) ^ 0x2545f491) >>> 0 || 0x6d2b79f5;
    return function next() {
      x ^= x << 13;
      x >>>= 0;
      x ^= x >>> 17;
      x ^= x << 5;
      x >>>= 0;
      return x / 4294967296;
    };
  }

  /** One round: γ draws u; drafts are accepted while u < α; then one recovered (or bonus) token. */
  function simulateRound(rng, alpha, gamma) {
    check(alpha, gamma);
    const draws = [];
    for (let i = 0; i < gamma; i++) draws.push(rng());
    let accepted = 0;
    while (accepted < gamma && draws[accepted] < alpha) accepted++;
    return { draws, accepted, tokens: accepted + 1, bonus: accepted === gamma };
  }

  function findBound(data, depth) {
    if (!data || typeof data !== "object" || depth > 2) return null;
    const b = data.bound;
    if (b && typeof b === "object" && isNum(b.alpha) && isNum(b.c) && isNum(b.v)) return b;
    for (const value of Object.values(data)) {
      const found = findBound(value, depth + 1);
      if (found) return found;
    }
    return null;
  }

  function validMeasurement(m) {
    if (!(m.alpha >= 0 && m.alpha <= 1) || !(m.c >= 0) || !(m.v > 0)) {
      throw new RangeError("the measurement's α, c or v is out of range");
    }
    return m;
  }

  /** {alpha, c, v, gamma, points: [{gamma, speedup, label}], kind} from the demo's JSON
   *  (derived.fit and local_sweep) or a bench JSON (bound {alpha, c, v}). */
  function parseMeasurement(data) {
    const fit = data && data.derived && data.derived.fit;
    if (fit && isNum(fit.alpha) && isNum(fit.cost) && isNum(fit.verify_cost)) {
      const sweep = Array.isArray(data.local_sweep) ? data.local_sweep : [];
      const points = sweep
        .filter((p) => p && Number.isInteger(p.gamma) && isNum(p.speedup))
        .map((p) => ({ gamma: p.gamma, speedup: p.speedup, label: "local sweep" }));
      if (Number.isInteger(fit.gamma) && isNum(fit.speedup)) {
        points.push({ gamma: fit.gamma, speedup: fit.speedup, label: NETWORK_LABEL });
      }
      const gamma = Number.isInteger(fit.gamma) ? fit.gamma : null;
      return validMeasurement({ kind: "demo", alpha: fit.alpha, c: fit.cost, v: fit.verify_cost, gamma, points });
    }
    const bound = findBound(data, 0);
    if (bound) {
      const gamma = Number.isInteger(bound.gamma) ? bound.gamma : null;
      return validMeasurement({ kind: "bench", alpha: bound.alpha, c: bound.c, v: bound.v, gamma, points: [] });
    }
    throw new Error("neither a demo report (derived.fit) nor a bench result (bound)");
  }

  root.SpecTheory = Object.freeze({
    MAX_THEORY_GAMMA,
    expectedTokens,
    speedup,
    optimalGamma,
    speedupCurve,
    makeRng,
    simulateRound,
    parseMeasurement,
  });

  if (typeof document === "undefined") return; // loaded for its formulas only (Node, a worker)

  // ---- the page ------------------------------------------------------------------------------
  const T = root.SpecTheory;
  const $ = (id) => document.getElementById(id);
  const SVG_NS = "http://www.w3.org/2000/svg";
  const MAX_GAMMA = 16;
  const MAX_ROUNDS = 200000;
  const TICK_MS = 50;
  const FETCH_TIMEOUT_MS = 8000;
  const COLORS = { line: "#2f6fdf", opt: "#d9822b", measured: "#7a3fb0", network: "#1f8a4c", grid: "#d9dde5", muted: "#5d6678" };

  const params = { alpha: 0.8, gamma: 4, cost: 0.05, verify: 1 };
  const LIMITS = { alpha: [0, 1], gamma: [1, MAX_GAMMA], cost: [0, 1], verify: [0.01, 10] };
  let measured = null;
  const sim = { rng: null, rounds: 0, tokens: 0, means: [], last: null, timer: null, budget: 0 };

  function svgEl(tag, attrs, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function show(id, text, raw) {
    const node = $(id);
    node.textContent = text;
    node.setAttribute("data-value", String(raw));
  }

  const fmt = (x, digits) => (isNum(x) ? String(+x.toFixed(digits)) : "–");

  // ---- parameters ---------------------------------------------------------------------------
  function clampParam(name, value) {
    const [lo, hi] = LIMITS[name];
    const v = Math.min(hi, Math.max(lo, value));
    return name === "gamma" ? Math.round(v) : v;
  }

  function setParam(name, value, source) {
    if (!isNum(value)) return false;
    params[name] = clampParam(name, value);
    const range = $(name);
    const number = $(name + "-num");
    if (source !== range) range.value = String(params[name]);
    if (source !== number) number.value = String(+params[name].toFixed(4));
    return true;
  }

  function bindParam(name) {
    for (const input of [$(name), $(name + "-num")]) {
      input.addEventListener("input", () => {
        if (!setParam(name, parseFloat(input.value), input)) return;
        if (name === "alpha" || name === "gamma") resetSim();
        renderTheory();
        renderSim();
      });
    }
  }

  // ---- S(γ) chart --------------------------------------------------------------------------
  function niceCeil(x) {
    const p = Math.pow(10, Math.floor(Math.log10(x)));
    return [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10].map((f) => f * p).find((m) => m >= x);
  }

  function speedupFrame(curve) {
    const peaks = [1.05, ...curve, ...(measured ? measured.points.map((p) => p.speedup) : [])];
    const yMax = niceCeil(Math.max(...peaks.filter(isNum)) * 1.08);
    const W = 480;
    const H = 240;
    const left = 40;
    const right = 12;
    const top = 12;
    const bottom = H - 28;
    return {
      W,
      H,
      left,
      right,
      top,
      bottom,
      yMax,
      x: (g) => left + ((g - 1) * (W - left - right)) / (MAX_GAMMA - 1),
      y: (s) => bottom - ((bottom - top) * Math.min(Math.max(s, 0), yMax)) / yMax,
    };
  }

  function speedupAxes(f) {
    const nodes = [];
    for (const s of [0, f.yMax / 2, f.yMax]) {
      nodes.push(svgEl("line", { x1: f.left, x2: f.W - f.right, y1: f.y(s), y2: f.y(s), stroke: COLORS.grid }));
      nodes.push(svgEl("text", { x: f.left - 5, y: f.y(s) + 4, "text-anchor": "end" }, fmt(s, 2)));
    }
    nodes.push(svgEl("line", { id: "break-even", x1: f.left, x2: f.W - f.right, y1: f.y(1), y2: f.y(1), stroke: COLORS.muted, "stroke-dasharray": "4 4" }));
    for (let g = 1; g <= MAX_GAMMA; g++) {
      if (g === 1 || g % 3 === 0 || g === MAX_GAMMA) {
        nodes.push(svgEl("text", { x: f.x(g), y: f.bottom + 16, "text-anchor": "middle" }, g));
      }
    }
    nodes.push(svgEl("text", { x: f.W - f.right, y: f.H - 1, "text-anchor": "end" }, "γ"));
    nodes.push(svgEl("text", { x: 2, y: f.top - 2 }, "S"));
    return nodes;
  }

  function speedupCurveNodes(f, curve, opt) {
    const d = curve.map((s, i) => (i ? "L" : "M") + f.x(i + 1).toFixed(1) + " " + f.y(s).toFixed(1)).join(" ");
    const nodes = [
      svgEl("line", { id: "cur-marker", "data-gamma": params.gamma, x1: f.x(params.gamma), x2: f.x(params.gamma), y1: f.top, y2: f.bottom, stroke: "#9aa3b5", "stroke-width": 1.5 }),
      svgEl("path", { id: "speedup-line", d, fill: "none", stroke: COLORS.line, "stroke-width": 2 }),
    ];
    curve.forEach((s, i) => {
      nodes.push(svgEl("circle", { class: "theory-point", "data-gamma": i + 1, "data-speedup": s, cx: f.x(i + 1), cy: f.y(s), r: 2.5, fill: COLORS.line }));
    });
    const s = curve[opt - 1];
    nodes.push(svgEl("circle", { id: "opt-marker", "data-gamma": opt, "data-speedup": s, cx: f.x(opt), cy: f.y(s), r: 7, fill: "none", stroke: COLORS.opt, "stroke-width": 3 }));
    const anchor = opt > MAX_GAMMA - 3 ? "end" : "start";
    nodes.push(svgEl("text", { x: f.x(opt) + (anchor === "end" ? -10 : 10), y: Math.max(f.top + 10, f.y(s) - 8), "text-anchor": anchor, fill: COLORS.opt }, "best γ = " + opt));
    return nodes;
  }

  function measuredNodes(f) {
    if (!measured) return [];
    return measured.points
      .filter((p) => p.gamma >= 1 && p.gamma <= MAX_GAMMA)
      .map((p) => {
        const [cx, cy] = [f.x(p.gamma), f.y(p.speedup)];
        const common = { class: "measured", "data-gamma": p.gamma, "data-speedup": p.speedup, "data-label": p.label };
        const node = p.label === NETWORK_LABEL
          ? svgEl("path", { ...common, d: `M${cx} ${cy - 6}L${cx + 6} ${cy}L${cx} ${cy + 6}L${cx - 6} ${cy}Z`, fill: COLORS.network })
          : svgEl("rect", { ...common, x: cx - 4, y: cy - 4, width: 8, height: 8, fill: COLORS.measured });
        node.appendChild(svgEl("title", {}, p.label + ": γ = " + p.gamma + ", S = " + fmt(p.speedup, 3)));
        return node;
      });
  }

  function renderTheory() {
    const { alpha, gamma, cost, verify } = params;
    const curve = T.speedupCurve(alpha, cost, verify, MAX_GAMMA);
    const opt = T.optimalGamma(alpha, cost, MAX_GAMMA, verify);
    const omega = T.expectedTokens(alpha, gamma);
    show("omega", fmt(omega, 3), omega);
    show("speedup", fmt(curve[gamma - 1], 3), curve[gamma - 1]);
    show("opt-gamma", String(opt), opt);
    show("opt-speedup", fmt(curve[opt - 1], 3), curve[opt - 1]);
    show("omega-target", fmt(omega, 3), omega);
    const f = speedupFrame(curve);
    $("speedup-chart").replaceChildren(...speedupAxes(f), ...speedupCurveNodes(f, curve, opt), ...measuredNodes(f));
  }

  // ---- rounds ----------------------------------------------------------------------------------
  function seed() {
    const s = parseInt($("seed").value, 10);
    return Number.isFinite(s) ? s : 1;
  }

  function resetSim() {
    Object.assign(sim, { rng: T.makeRng(seed()), rounds: 0, tokens: 0, means: [], last: null, budget: 0 });
  }

  function stepOnce() {
    if (sim.rounds >= MAX_ROUNDS) return false;
    const round = T.simulateRound(sim.rng, params.alpha, params.gamma);
    sim.rounds += 1;
    sim.tokens += round.tokens;
    sim.means.push(sim.tokens / sim.rounds);
    sim.last = round;
    return true;
  }

  function drawCell(text, outcome, title) {
    const node = document.createElement("span");
    node.className = "draw";
    node.setAttribute("data-outcome", outcome);
    node.textContent = text;
    node.title = title;
    return node;
  }

  function renderRound() {
    const r = sim.last;
    const box = $("draws");
    if (!r) {
      box.replaceChildren();
      box.removeAttribute("data-round");
      return;
    }
    const cells = r.draws.map((u, i) => {
      const outcome = i < r.accepted ? "accept" : i === r.accepted ? "reject" : "unused";
      const title = outcome === "unused" ? "not checked: an earlier draft was rejected" : "u = " + u.toFixed(4) + (u < params.alpha ? " < α" : " ≥ α");
      return drawCell(u.toFixed(3), outcome, title);
    });
    cells.push(drawCell(r.bonus ? "+1 bonus" : "+1 recovered", r.bonus ? "bonus" : "recovered", "the target's own token"));
    box.replaceChildren(...cells);
    box.setAttribute("data-round", String(sim.rounds));
    box.setAttribute("data-accepted", String(r.accepted));
    box.setAttribute("data-tokens", String(r.tokens));
    const rejected = r.bonus ? "all " + r.draws.length + " drafts accepted, plus a bonus token" : r.accepted + " accepted, draft " + (r.accepted + 1) + " rejected (u ≥ α), plus the recovered token";
    $("round-summary").textContent = "Round " + sim.rounds + ": " + rejected + " = " + r.tokens + (r.tokens === 1 ? " token." : " tokens.");
  }

  function meanChartNodes() {
    const W = 480;
    const H = 200;
    const left = 40;
    const right = 12;
    const top = 10;
    const bottom = H - 24;
    const yMax = params.gamma + 1;
    const n = sim.means.length;
    const x = (i) => left + ((W - left - right) * i) / Math.max(1, n - 1);
    const y = (m) => bottom - ((bottom - top) * (m - 1)) / Math.max(1e-9, yMax - 1);
    const omega = T.expectedTokens(params.alpha, params.gamma);
    const nodes = [];
    for (const m of [1, yMax]) {
      nodes.push(svgEl("line", { x1: left, x2: W - right, y1: y(m), y2: y(m), stroke: COLORS.grid }));
      nodes.push(svgEl("text", { x: left - 5, y: y(m) + 4, "text-anchor": "end" }, m));
    }
    nodes.push(svgEl("line", { id: "omega-line", x1: left, x2: W - right, y1: y(omega), y2: y(omega), stroke: COLORS.opt, "stroke-dasharray": "5 4", "stroke-width": 1.5 }));
    const k = Math.min(n, 400);
    const parts = [];
    for (let j = 0; j < k; j++) {
      const i = k === 1 ? 0 : Math.round((j * (n - 1)) / (k - 1));
      parts.push((j ? "L" : "M") + x(i).toFixed(1) + " " + y(sim.means[i]).toFixed(1));
    }
    if (parts.length) nodes.push(svgEl("path", { id: "mean-line", d: parts.join(" "), fill: "none", stroke: COLORS.line, "stroke-width": 2 }));
    nodes.push(svgEl("text", { x: W - right, y: H - 4, "text-anchor": "end" }, n ? n + " rounds" : "no round yet"));
    return nodes;
  }

  function renderSim() {
    renderRound();
    show("rounds", String(sim.rounds), sim.rounds);
    show("sim-tokens", String(sim.tokens), sim.tokens);
    const mean = sim.rounds ? sim.tokens / sim.rounds : null;
    show("running-mean", mean === null ? "–" : fmt(mean, 3), mean === null ? "" : mean);
    $("mean-chart").replaceChildren(...meanChartNodes());
  }

  function setPlaying(on) {
    const button = $("play");
    if (sim.timer) clearInterval(sim.timer);
    sim.timer = on ? setInterval(tick, TICK_MS) : null;
    button.setAttribute("aria-pressed", on ? "true" : "false");
    button.textContent = on ? "Pause" : "Play";
  }

  function tick() {
    sim.budget += (parseFloat($("speed").value) * TICK_MS) / 1000;
    let any = false;
    while (sim.budget >= 1) {
      sim.budget -= 1;
      if (!stepOnce()) {
        setPlaying(false);
        break;
      }
      any = true;
    }
    if (any) renderSim();
  }

  // ---- measurements ----------------------------------------------------------------------------
  function setStatus(text, state) {
    const node = $("measured-status");
    node.textContent = text;
    node.setAttribute("data-state", state);
  }

  function applyMeasurement(data, source) {
    let m;
    try {
      m = T.parseMeasurement(data);
    } catch (err) {
      setStatus("cannot use " + source + ": " + err.message, "error");
      console.warn("simulator: cannot use the measurement from " + source, err);
      return false;
    }
    measured = m;
    setParam("alpha", m.alpha);
    setParam("cost", m.c);
    setParam("verify", m.v);
    if (m.gamma !== null) setParam("gamma", m.gamma);
    const pts = m.points.length ? ", " + m.points.length + " measured points" : "";
    setStatus(m.kind + " measurement from " + source + ": α = " + fmt(m.alpha, 4) + ", c = " + fmt(m.c, 4) + ", v = " + fmt(m.v, 4) + pts, "loaded");
    $("measured-legend").hidden = m.points.length === 0;
    $("network-legend").hidden = !m.points.some((p) => p.label === NETWORK_LABEL);
    resetSim();
    renderTheory();
    renderSim();
    return true;
  }

  function embedded() {
    const block = $("measured");
    const text = block ? block.textContent.trim() : "";
    if (!text || text === "null") return false;
    try {
      return applyMeasurement(JSON.parse(text), "this page");
    } catch (err) {
      setStatus("the embedded measurement is not valid JSON", "error");
      return false;
    }
  }

  async function fromUrl(param) {
    let url;
    try {
      url = new URL(param, window.location.href);
    } catch (err) {
      setStatus("not a URL: " + param, "error");
      return;
    }
    // a path on this site only: the page never fetches from elsewhere (its CSP allows 'self' alone)
    if (url.origin !== window.location.origin) {
      setStatus("only a path on this site can be loaded, not " + url.href.slice(0, 80), "error");
      return;
    }
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), FETCH_TIMEOUT_MS);
    setStatus("loading " + url.href + " …", "loading");
    try {
      const resp = await fetch(url.href, { signal: abort.signal, cache: "no-store" });
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      applyMeasurement(await resp.json(), url.pathname);
    } catch (err) {
      setStatus("cannot load " + url.href + ": " + err.message, "error");
      console.warn("simulator: cannot load the measurement", err);
    } finally {
      clearTimeout(timer);
    }
  }

  function fromFile(file) {
    file
      .text()
      .then((text) => applyMeasurement(JSON.parse(text), file.name))
      .catch((err) => setStatus("cannot read " + file.name + ": " + err.message, "error"));
  }

  // ---- start -----------------------------------------------------------------------------------
  function start() {
    for (const name of Object.keys(params)) {
      setParam(name, params[name]);
      bindParam(name);
    }
    $("step").addEventListener("click", () => {
      if (stepOnce()) renderSim();
    });
    $("play").addEventListener("click", () => setPlaying(!sim.timer));
    $("reset").addEventListener("click", () => {
      resetSim();
      renderSim();
    });
    $("seed").addEventListener("input", () => {
      resetSim();
      renderSim();
    });
    $("measured-file").addEventListener("change", (ev) => {
      const file = ev.target.files && ev.target.files[0];
      if (file) fromFile(file);
    });
    resetSim();
    renderTheory();
    renderSim();
    const param = new URLSearchParams(window.location.search).get("measured");
    if (!embedded() && param) fromUrl(param);
    document.body.setAttribute("data-ready", "true");
  }

  root.SpecSimulator = Object.freeze({ params, sim, applyMeasurement, setParam, measured: () => measured });
  start();
})(globalThis);
