// headrace's web UI: the server's pipelines, and for each its DAG, figures, queryable views, log,
// lifecycle buttons, checkpoint and configuration. No build step and no request to another host: it reads the server's own
// REST API (docs/control-plane.md), every second.

const TOKEN_KEY = "headrace-token";
const REFRESH_MS = 1000;
const BAD_STATUSES = new Set(["failed", "restarting"]);

// The token comes once in the URL the server prints (/?token=...); it is kept for this tab only.
const token = (() => {
  const params = new URLSearchParams(location.search);
  if (params.has("token")) {
    sessionStorage.setItem(TOKEN_KEY, params.get("token"));
    history.replaceState(null, "", location.pathname + location.hash);
  }
  return sessionStorage.getItem(TOKEN_KEY) || "";
})();

async function api(method, path, body) {
  const headers = {};
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const answer = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const json = (answer.headers.get("Content-Type") || "").startsWith("application/json");
  const data = json ? await answer.json() : await answer.text();
  if (!answer.ok) throw new Error(json ? data.error : data);
  return data;
}

// A DOM element: el("td", {class: "x"}, "text", child, ...); text is never parsed as HTML.
function el(tag, attributes = {}, ...children) {
  const svg = ["svg", "g", "rect", "text", "path", "polyline", "title"].includes(tag);
  const node = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (value !== undefined && value !== null) node.setAttribute(name, value);
  }
  for (const child of children.flat()) node.append(child instanceof Node ? child : String(child));
  return node;
}

const number = (value, digits = 0) =>
  value === undefined || value === null ? "–" : Number(value).toLocaleString("en", { maximumFractionDigits: digits });

// Falling behind: the sources' backlog grew over the last three batches.
function fallingBehind(recent) {
  const lags = recent.slice(-3).map((batch) => batch.lag);
  return lags.length === 3 && lags.every((lag) => typeof lag === "number") && lags[0] < lags[1] && lags[1] < lags[2];
}

function health(entry, figures) {
  if (BAD_STATUSES.has(entry.status)) return { bad: true, why: entry.reason };
  if (figures && fallingBehind(figures.recent)) return { bad: true, why: "falling behind: its backlog grows" };
  return { bad: false, why: "" };
}

function statusBadge(entry, bad) {
  const kind = bad ? "bad" : entry.status === "running" ? "good" : "";
  return el("span", { class: `badge ${kind}`, id: "status", title: entry.reason }, entry.status);
}

// -- the list of pipelines -------------------------------------------------------------------------

async function listPage(main, current) {
  const entries = await api("GET", "/api/pipelines");
  const rows = await Promise.all(entries.map(async (entry) => {
    const figures = await api("GET", `/api/pipelines/${encodeURIComponent(entry.name)}/figures`);
    const { bad, why } = health(entry, figures);
    return el("tr", { "data-pipeline": entry.name },
      el("td", {}, el("a", { href: `#/p/${encodeURIComponent(entry.name)}` }, entry.name)),
      el("td", {}, statusBadge(entry, bad), " ", el("span", { class: "quiet" }, why)),
      el("td", {}, number(figures.totals.input_rows)),
      el("td", {}, number(figures.last.rows_per_second, 1)),
      el("td", {}, number(figures.last.lag)),
      el("td", {}, figures.totals.dead_letters ? el("span", { class: "badge bad" }, number(figures.totals.dead_letters)) : "0"),
      el("td", {}, number(entry.restarts)));
  }));
  if (!current()) return;
  main.replaceChildren(
    el("h2", {}, "Pipelines"),
    entries.length === 0 ? el("p", { class: "quiet" }, "No pipelines: headrace submit FILE starts one.") :
      el("table", { id: "pipelines" },
        el("tr", {}, ["pipeline", "status", "records", "records/s", "backlog", "dead letters", "restarts"]
          .map((title) => el("th", {}, title))),
        rows));
}

// -- one pipeline -------------------------------------------------------------------------------

// Each step in the layer after its inputs', left to right; edges from an input's right side. As
// Gearpump draws it: a step's box grows with its records per second in the last batch, an edge is
// as wide as the rate of the step it comes from, and a failing pipeline or a slow sink is red.
function dagSvg(nodes, bad, steps = {}) {
  const rates = Object.values(steps).map((step) => step.records_per_second || 0);
  const scale = (rate) => Math.log1p(rate || 0) / Math.log1p(Math.max(1, ...rates));  // 0..1
  const layer = new Map();
  const depth = (node) => {
    if (!layer.has(node.name)) {
      layer.set(node.name, 0);
      const inputs = node.inputs.map((name) => nodes.find((n) => n.name === name)).filter(Boolean);
      layer.set(node.name, inputs.length ? 1 + Math.max(...inputs.map(depth)) : 0);
    }
    return layer.get(node.name);
  };
  nodes.forEach(depth);
  const place = new Map();
  const rowsUsed = [];
  for (const node of nodes) {
    const column = layer.get(node.name);
    const row = rowsUsed[column] = (rowsUsed[column] ?? -1) + 1;
    place.set(node.name, { x: 10 + column * 180, y: 10 + row * 80 });
  }
  const width = 20 + 180 * (Math.max(0, ...layer.values()) + 1);
  const height = 20 + 80 * Math.max(1, ...rowsUsed.map((r) => r + 1));
  const edges = nodes.flatMap((node) => node.inputs.filter((input) => place.has(input)).map((input) => {
    const from = place.get(input), to = place.get(node.name);
    const [x1, y1, x2, y2] = [from.x + 150, from.y + 20, to.x, to.y + 20];
    const rate = steps[input]?.records_per_second;
    return el("path", { class: "edge", "data-from": input, "data-to": node.name, "data-rate": rate ?? "",
                        "stroke-width": (1.5 + 6 * scale(rate)).toFixed(1),
                        d: `M${x1},${y1} C${x1 + 15},${y1} ${x2 - 15},${y2} ${x2},${y2}` });
  }));
  const boxes = nodes.map((node) => {
    const { x, y } = place.get(node.name);
    const step = steps[node.name] || {};
    const measured = step.records_total !== undefined ? `${number(step.records_total)} records` +
      (step.records_per_second ? `, ${number(step.records_per_second)}/s` : "") :
      step.write_ms_last_batch !== undefined ? `writes in ${number(step.write_ms_last_batch)} ms` : "";
    const red = bad || step.slow;
    return el("g", { class: `node${red ? " bad" : ""}${step.slow ? " slow" : ""}${node.name === openStep ? " open" : ""}`,
                     "data-step": node.name, "data-records": step.records_total ?? "", transform: `translate(${x},${y})`,
                     onclick: () => { openStep = openStep === node.name ? null : node.name; render(); } },
      el("title", {}, `${node.kind}${node.type ? " " + node.type : ""} (${node.defined_at})` +
        (step.slow ? `: slow, its last write took ${step.write_ms_last_batch} ms` : "")),
      el("rect", { width: 150, height: (48 + 16 * scale(step.records_per_second)).toFixed(1), rx: 4 }),
      el("text", { x: 8, y: 16 }, node.name),
      el("text", { x: 8, y: 30, class: "quiet" }, node.type || node.kind.replaceAll("_", " ")),
      el("text", { x: 8, y: 44, class: "quiet figures" }, measured));
  });
  return el("svg", { class: `dag${bad ? " bad" : ""}`, width, height, viewBox: `0 0 ${width} ${height}` }, edges, boxes);
}

// Values of the recent batches, as a line.
function chart(values, id = "chart", width = 500) {
  const top = Math.max(1, ...values);
  const step = values.length > 1 ? (width - 10) / Math.max(values.length - 1, 1) : 0;
  const points = values.map((value, i) => `${5 + i * Math.min(4, step)},${65 - (60 * value) / top}`).join(" ");
  return el("svg", { class: "chart", width, height: 70, id },
    el("polyline", { points, fill: "none", stroke: "#3d6fb6", "stroke-width": 2 }));
}

// -- the drawer of one step: what the plan says of it and its figures -------------------------------

let openStep = null;  // the step whose drawer is open: a click on its box opens it, another closes it

// A step's figure in each recent batch that has it (``step_records`` or ``sink_ms``).
const series = (recent, key, name) => recent.map((batch) => (batch[key] || {})[name]).filter((v) => typeof v === "number");

function stepDrawer(nodes, steps, recent, stateOnDisk) {
  const node = nodes.find((n) => n.name === openStep);
  if (!node) return [];
  const step = steps[node.name] || {};
  const readBy = nodes.filter((n) => n.inputs.includes(node.name)).map((n) => n.name);
  const counted = step.records_total !== undefined, sink = step.write_seconds_total !== undefined;
  const fields = [
    ["kind", "kind", node.type ? `${node.kind.replaceAll("_", " ")} (${node.type})` : node.kind.replaceAll("_", " ")],
    ["defined_at", "defined at", node.defined_at], ["inputs", "reads", node.inputs.join(", ") || "–"],
    ["read_by", "read by", readBy.join(", ") || "–"], ["keys", "keys", (node.keys || []).join(", ") || "–"],
    ["event_time", "event time", node.event_time],
    ...(counted ? [["records_total", "records", number(step.records_total)],
                   ["records_last_batch", "records in the last batch", number(step.records_last_batch)],
                   ["records_per_second", "records/s in the last batch", number(step.records_per_second, 1)]] : []),
    ...(step.model_version !== undefined ? [["model_version", "model version (last batch)", `v${step.model_version}`]] : []),
    ...(step.drift_flags_total !== undefined ? [["drift_flags_total", "drift flagged", number(step.drift_flags_total)],
                                                ["drift_flags_last_batch", "drift flagged in the last batch",
                                                 number(step.drift_flags_last_batch ?? 0)]] : []),
    ...(sink ? [["write_seconds_total", "write time in all", `${number(step.write_seconds_total, 1)} s`],
                ["write_ms_last_batch", "write time of the last batch", `${number(step.write_ms_last_batch)} ms`],
                ["slow", "slow", step.slow ? "yes: its write took more than half of the last batch" : "no"]] : []),
  ];
  const records = series(recent, "step_records", node.name), writes = series(recent, "sink_ms", node.name);
  const state = stateOnDisk.filter((operator) => operator.step === node.name);
  return [el("aside", { id: "drawer", "data-step": node.name },
    el("h3", {}, node.name, " ", el("button", { id: "drawer-close", title: "close",
                                                onclick: () => { openStep = null; render(); } }, "×")),
    fieldsTable("step-fields", fields),
    records.length ? [el("p", { class: "quiet" }, "records per batch"), chart(records, "step-records-chart", 300)] : [],
    writes.length ? [el("p", { class: "quiet" }, "write ms per batch"), chart(writes, "step-writes-chart", 300)] : [],
    state.length ? statePartitions(state, "step-state-partitions") : [],
    counted || sink || node.kind === "sink" ? [] :
      el("p", { class: "quiet", id: "not-counted" }, "Its records are not counted: it runs where they cannot be counted " +
        "exactly at no cost (after another step in one Python stage, or per batch below the query; " +
        "docs/control-plane.md)."))];
}

// When the last batch ended less its watermark (none past the end of a bounded input).
function watermarkLag(last) {
  const watermark = Date.parse(last.watermark || "");
  if (!watermark || watermark <= 0 || new Date(watermark).getUTCFullYear() >= 5000 || !last.at) return undefined;
  return Math.round(last.at - watermark / 1000);
}

// Where the last batch's time went, by Spark's phases, longest first.
function phases(last) {
  const shown = Object.entries(last.phases_ms || {}).sort((a, b) => b[1] - a[1])
    .map(([phase, ms]) => `${phase} ${number(ms)} ms`);
  return el("p", { class: "quiet", id: "phases" }, shown.length ? `last batch: ${shown.join(", ")}` : "");
}

function kpis(entry, figures) {
  const last = figures.last;
  const shown = [
    ["batches", figures.totals.batches], ["records", figures.totals.input_rows],
    ["records/s", number(last.rows_per_second, 1)], ["batch ms", last.batch_ms], ["watermark", last.watermark || "–"],
    ["watermark lag s", watermarkLag(last)], ["state rows", last.state_rows],
    ["state memory", last.state_memory_bytes === undefined ? undefined : `${number(last.state_memory_bytes / 1048576, 1)} MiB`],
    ["backlog", last.lag], ["dead letters", figures.totals.dead_letters],
    ["late dropped", figures.totals.late_rows_dropped], ["restarts", entry.restarts],
  ];
  return el("div", { class: "kpis" }, shown.map(([name, value]) =>
    el("div", { class: "kpi", "data-kpi": name }, el("b", {}, typeof value === "number" ? number(value) : value ?? "–"),
      name)));
}

function viewsTable(views) {
  return el("table", { id: "state-views" }, views.map((v) => el("tr", {}, el("td", {}, v.view),
    el("td", {}, `as of batch ${v.batch_id}`), el("td", {}, `watermark ${v.watermark ?? "–"}`))));
}

// The views, and a lookup form kept across refreshes (made again when the views change): the
// same element stays in the page, so what is typed in it keeps its focus.
function statePanel(name, views, kept) {
  const names = views.map((v) => v.view).join(",");
  if (kept && kept.dataset.views === names) {
    kept.querySelector("#state-views")?.replaceWith(viewsTable(views));  // no table while there is no view
    return kept;
  }
  const result = el("pre", { id: "state-result" }, "");
  const view = el("select", { id: "state-view" }, views.map((v) => el("option", { value: v.view }, v.view)));
  const key = el("input", { id: "state-key", placeholder: "a key, or a prefix" });
  const show = async (path) => {
    try {
      result.textContent = JSON.stringify(await api("GET", path), null, 1);
    } catch (error) {
      result.textContent = error.message;
    }
  };
  const base = () => `/api/pipelines/${encodeURIComponent(name)}/state/${encodeURIComponent(view.value)}`;
  return el("section", { id: "state", "data-views": names }, el("h3", {}, "Queryable state"),
    views.length === 0 ? el("p", { class: "quiet" }, "No views yet (stream.queryable(\"name\") makes one; it " +
                                                      "appears with the pipeline's first batch).") : [
      viewsTable(views),
      el("p", {}, view, " ", key, " ",
        el("button", { id: "state-lookup", onclick: () => show(`${base()}/${encodeURIComponent(key.value)}`) }, "Look up"),
        el("button", { id: "state-scan", onclick: () => show(`${base()}?prefix=${encodeURIComponent(key.value)}`) },
          "Keys with this prefix")),
      result]);
}

const moment = (seconds) => new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 19);

// The errors the pipeline's drivers ended with, each once (the same error on another record too).
function exceptionsTable(errors) {
  return el("section", {}, el("h3", {}, "Exceptions"),
    errors.length === 0 ? el("p", { class: "quiet" }, "None.") :
      el("table", { id: "exceptions" },
        el("tr", {}, ["count", "error", "first", "last"].map((title) => el("th", {}, title))),
        errors.map((error) => el("tr", {}, el("td", { class: "count" }, el("span", { class: "badge bad" }, error.count)),
          el("td", { class: "message" }, error.message), el("td", {}, moment(error.first_at)),
          el("td", {}, moment(error.last_at))))));
}

function lifecycle(name, message) {
  const act = async (action) => {
    try {
      const entry = await api("POST", `/api/pipelines/${encodeURIComponent(name)}/${action}`);
      message.textContent = `${action}: ${entry.status} (${entry.reason})`;
    } catch (error) {
      message.textContent = `${action} refused: ${error.message}`;
    }
  };
  return el("p", {}, ["pause", "resume", "stop", "restart"].map((action) =>
    el("button", { "data-action": action, onclick: () => act(action) }, action)), message);
}

// The pipeline page's tabs, by the name its address ends with (#/p/NAME/checkpoints); overview: none.
const TABS = { overview: "Overview", checkpoints: "Checkpoints", configuration: "Configuration" };

function tabBar(name, shownTab) {
  return el("nav", { class: "tabs" }, Object.entries(TABS).map(([tab, title]) =>
    el("a", { href: `#/p/${encodeURIComponent(name)}${tab === "overview" ? "" : `/${tab}`}`, "data-tab": tab,
              class: tab === shownTab ? "active" : undefined }, title)));
}

async function overviewTab(name, path, figures, bad, first) {
  const [plan, views, log, errors, checkpoint] = await Promise.all([api("GET", `${path}/dag`),
    api("GET", `${path}/state`), api("GET", `${path}/logs?lines=30`), api("GET", `${path}/exceptions`),
    openStep ? api("GET", `${path}/checkpoints?limit=1`) : { state_on_disk: [] }]);  // a drawer shows its state
  return [
    el("section", {}, el("h3", {}, "DAG"), dagSvg(plan.nodes, bad, figures.steps)),
    ...stepDrawer(plan.nodes, figures.steps, figures.recent, checkpoint.state_on_disk),
    el("section", {}, el("h3", {}, "Records per batch (recent batches)"),
      chart(figures.recent.map((batch) => batch.input_rows || 0)), phases(figures.last)),
    exceptionsTable(errors.exceptions),
    statePanel(name, views.views, first ? null : document.getElementById("state")),
    el("section", {}, el("h3", {}, "Driver log"), el("pre", { id: "log" }, log || "(empty)")),
  ];
}

const bytes = (value) => value === undefined || value === null ? "–" : value < 1024 ? `${number(value)} B` :
  value < 1048576 ? `${number(value / 1024, 1)} KiB` : `${number(value / 1048576, 1)} MiB`;
const preciseMoment = (seconds) => new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 23);

// Name and value rows; each row's data-field is its field's name.
function fieldsTable(id, fields) {
  return el("table", { id, class: "fields" }, fields.map(([field, title, value]) =>
    el("tr", { "data-field": field }, el("th", {}, title), el("td", {}, value ?? "–"))));
}

async function checkpointsTab(name, path) {
  const info = await api("GET", `${path}/checkpoints`);
  const summary = [
    ["location", "location", info.checkpoint ?? "none yet (its first driver makes it)"],
    ["committed", "committed batches", number(info.committed_batches)],
    ["last", "last committed batch", info.last_committed],
    ["kept", "batches whose files Spark keeps", number(info.retained_batches)],
    ["size", "size on disk", `${bytes(info.size_bytes)}, of which state ${bytes(info.state_size_bytes)}`],
    ...info.state_operators.map((operator, i) => [`operator-${i}`, `state operator ${i} (${operator.operator})`,
      `${number(operator.rows)} rows, ${bytes(operator.memory_bytes)} in memory`]),
  ];
  const columns = ["batch", "committed", "duration ms", "input rows", "watermark", "state partitions"];
  return [
    el("section", {}, el("h3", {}, "Checkpoint"), fieldsTable("checkpoint-summary", summary)),
    statePartitions(info.state_on_disk),
    el("section", {}, el("h3", {}, "Committed batches, newest first"),
      info.batches.length === 0 ? el("p", { class: "quiet", id: "no-batches" }, "No batch committed yet.") :
        el("table", { id: "checkpoints" }, el("tr", {}, columns.map((title) => el("th", {}, title))),
          info.batches.map((batch) => el("tr", { "data-batch": batch.batch }, el("td", {}, batch.batch),
            el("td", {}, batch.committed_at ? preciseMoment(batch.committed_at) : "–"),
            el("td", {}, number(batch.duration_ms)), el("td", { class: "input-rows" }, number(batch.input_rows)),
            el("td", {}, batch.watermark ?? "–"), el("td", {}, batch.state_partitions ?? "–"))))),
  ];
}

// A partition this many times the median's size holds hot keys: its operator is drawn as skewed.
const SKEWED = 2;

const median = (sorted) => sorted.length % 2 ? sorted[(sorted.length - 1) / 2] :
  (sorted[sorted.length / 2 - 1] + sorted[sorted.length / 2]) / 2;

// Each stateful operator's state files, partition by partition, as bars: how evenly its keys spread.
function statePartitions(operators, id = "state-partitions") {
  const bars = (sizes) => {
    const top = Math.max(1, ...sizes);
    return el("svg", { class: "partitions", width: 8 * sizes.length + 2, height: 24 }, sizes.map((size, i) =>
      el("rect", { x: 1 + 8 * i, y: 23 - (22 * size) / top, width: 6, height: (22 * size) / top,
                   "data-partition": i, "data-bytes": size }, el("title", {}, `partition ${i}: ${bytes(size)}`))));
  };
  return el("section", {}, el("h3", {}, "State on disk, by partition"),
    operators.length === 0 ? el("p", { class: "quiet" }, "No state yet.") :
      el("table", { id },
        el("tr", {}, ["operator", "partitions", "smallest", "median", "largest", "skew", ""].map((t) => el("th", {}, t))),
        operators.map((op) => {
          const sorted = [...op.partition_bytes].sort((a, b) => a - b);
          const skewed = op.skew !== null && op.skew >= SKEWED;
          return el("tr", { "data-operator": op.operator_id, class: skewed ? "skewed" : undefined },
            el("td", {}, `${op.operator_id} (${op.operator ?? "?"}${op.step ? `, step ${op.step}` : ""})`),
            el("td", {}, sorted.length),
            el("td", {}, bytes(sorted[0])), el("td", {}, bytes(median(sorted))),
            el("td", {}, bytes(sorted[sorted.length - 1])),
            el("td", { class: "skew" }, op.skew === null ? "–" : skewed ? el("span", { class: "badge bad" }, `${op.skew}×`)
              : `${op.skew}×`),
            el("td", {}, bars(op.partition_bytes)));
        })));
}

const setting = (value) => typeof value === "string" ? value : JSON.stringify(value);

async function configurationTab(name, path) {
  const config = await api("GET", `${path}/config`);
  const pipeline = [
    ["pipeline", "pipeline", config.pipeline], ["name_in_file", "name in its file", config.name_in_file],
    ["file", "file", config.file], ["status", "status", config.status], ["state_dir", "state dir", config.state_dir],
    ["restart_strategy", "restart strategy", config.restart_strategy.description],
    ["trigger", "trigger", config.trigger],
    ["trigger_interval", "trigger interval", config.trigger_interval || (config.plan_recorded ? "none: as fast as it can" : null)],
    ["guarantee", "guarantee", config.guarantee],
  ];
  const connectors = [...config.sources.map((c) => ["source", c]), ...config.sinks.map((c) => ["sink", c])];
  return [
    el("section", {}, el("h3", {}, "Pipeline"), fieldsTable("config-pipeline", pipeline)),
    el("section", { id: "config-connectors" }, el("h3", {}, "Sources and sinks"),
      config.plan_recorded ? connectors.map(([role, connector]) =>
        el("div", { class: "connector", "data-role": role, "data-step": connector.name },
          el("h4", {}, `${role} ${connector.name} `,
            el("span", { class: "quiet" }, `${connector.type} (${connector.defined_at}), ${connector.guarantee}`)),
          fieldsTable(undefined, Object.entries(connector.settings).map(([key, value]) => [key, key, setting(value)])))) :
        el("p", { class: "quiet" }, "Not known yet: a driver records its plan when it starts its query.")),
  ];
}

// Show ``children`` in ``main``; an element among them that is in it already stays there, never taken
// out and put back (which would take the focus from a field in it), and the others go around it.
function showIn(main, children) {
  const kept = children.find((child) => child instanceof Node && child.parentNode === main);
  if (!kept) {
    main.replaceChildren(...children);
    return;
  }
  for (const child of [...main.childNodes]) if (child !== kept) child.remove();
  const at = children.indexOf(kept);
  kept.before(...children.slice(0, at));
  kept.after(...children.slice(at + 1));
}

async function pipelinePage(main, name, tab, first, current) {
  const path = `/api/pipelines/${encodeURIComponent(name)}`;
  const [entry, figures] = await Promise.all([api("GET", path), api("GET", `${path}/figures`)]);
  const { bad, why } = health(entry, figures);
  const message = first ? el("span", { id: "message", class: "quiet" }) : document.getElementById("message");
  const panels = tab === "checkpoints" ? await checkpointsTab(name, path) :
    tab === "configuration" ? await configurationTab(name, path) : await overviewTab(name, path, figures, bad, first);
  if (!current()) return;
  showIn(main, [
    el("h2", {}, name, " ", statusBadge(entry, bad), " ", el("span", { class: "quiet", id: "reason" }, why || entry.reason)),
    lifecycle(name, message),
    kpis(entry, figures),
    tabBar(name, tab),
    ...panels,
    el("p", { class: "quiet" }, el("a", { href: "#/" }, "all pipelines"))]);
}

// -- routing -------------------------------------------------------------------------------------

// Each render is numbered; one that a later render overtook (a new address meanwhile) shows nothing.
// The page's renders so far are in #main's data-renders (what a test waits for).
let shown = "";
let started = 0;
let rendering = false;
async function render() {
  const main = document.getElementById("main");
  const route = location.hash.replace(/^#/, "") || "/";
  const first = route !== shown;
  const mine = ++started;
  const current = () => mine === started;
  shown = route;
  rendering = true;
  try {
    const match = route.match(/^\/p\/([^/]+)(?:\/([a-z]+))?$/);
    const tab = match && Object.hasOwn(TABS, match[2] ?? "") ? match[2] : "overview";
    if (match) await pipelinePage(main, decodeURIComponent(match[1]), tab, first, current);
    else await listPage(main, current);
  } catch (error) {
    if (!current()) return;
    main.replaceChildren(el("p", { class: "badge bad", id: "error" }, error.message), " ",
      el("a", { href: "#/" }, "all pipelines"));
    shown = "";
  } finally {
    if (current()) {
      rendering = false;
      main.dataset.renders = String(Number(main.dataset.renders || 0) + 1);
    }
  }
}

document.getElementById("server").textContent = location.host;
window.addEventListener("hashchange", render);
render();
setInterval(() => rendering || render(), REFRESH_MS);  // a refresh waits for the one under way
