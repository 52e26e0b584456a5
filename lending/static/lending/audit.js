// The Lending tab's audit panel: GET /router/v1/site/audit, newest first, a page at a time.
// It uses the page's own helpers (`api`, `el`, `fmtTime`), defined by the script before it.
"use strict";
(() => {
  const PAGE = 50;
  const ACTIONS = ["link.create", "link.update", "link.delete", "settings.update", "settings.reset",
    "guardian.create", "guardian.update", "guardian.delete", "model.load", "model.unload", "model.benchmark",
    "model.disable", "model.enable", "recipe.create", "recipe.update", "recipe.delete", "asset.bind", "asset.substitute",
    "asset.resolve", "api_key.create", "api_key.update", "api_key.revoke"];
  const view = {cursors: [null], open: new Set(), seq: 0, actors: new Set(), actions: new Set(ACTIONS)};
  const $ = id => document.getElementById(id);

  function params() {
    const p = new URLSearchParams({limit: String(PAGE)});
    const actor = $("audit-actor").value.trim(), action = $("audit-action").value;
    if (actor) p.set("actor", actor);
    if (action) p.set("action", action);
    const cursor = view.cursors[view.cursors.length - 1];
    if (cursor) p.set("before", cursor);
    return p;
  }
  function json(value) { return value === null || value === undefined ? "—" : JSON.stringify(value, null, 2); }
  function detail(r) {
    const states = el("div", {class: "audit-states"},
      el("div", {}, el("h3", {}, "Before"), el("pre", {"data-state": "before"}, json(r.before))),
      el("div", {}, el("h3", {}, "After"), el("pre", {"data-state": "after"}, json(r.after))));
    const where = el("div", {class: "muted"}, `${new Date(r.at_ms).toLocaleString()} · node ${r.node_id}` + (r.request_id ? ` · request ${r.request_id}` : ""));
    return el("tr", {class: "detail"}, el("td", {colspan: "4"}, where, states));
  }
  function fillChoices() {
    $("audit-actors").replaceChildren(...[...view.actors].sort().map(a => el("option", {value: a})));
    const select = $("audit-action"), chosen = select.value;
    select.replaceChildren(el("option", {value: ""}, "any action"), ...[...view.actions].sort().map(a => el("option", {value: a}, a)));
    select.value = chosen;
  }
  function render(doc) {
    view.doc = doc;
    const rows = [];
    for (const r of doc.rows) {
      const key = `${r.node_id}:${r.id}`;
      view.actors.add(r.actor); view.actions.add(r.action);
      rows.push(el("tr", {class: "group", "data-audit": key, onclick: () => { view.open.has(key) ? view.open.delete(key) : view.open.add(key); render(view.doc); }},
        el("td", {}, fmtTime(r.at_ms)), el("td", {}, r.actor), el("td", {}, el("span", {class: "badge"}, r.action)), el("td", {}, r.target)));
      if (view.open.has(key)) rows.push(detail(r));
    }
    if (!rows.length) rows.push(el("tr", {}, el("td", {colspan: "4", class: "muted"}, "No changes match these filters.")));
    $("audit-rows").tBodies[0].replaceChildren(...rows);
    fillChoices();
    const notes = [`Page ${view.cursors.length}.`];
    if ((doc.node_errors || []).length) notes.push("Not included: " + doc.node_errors.map(e => `${e.node_id} (${e.error})`).join(", ") + ".");
    $("audit-status").textContent = notes.join(" ");
    $("audit-status").className = (doc.node_errors || []).length ? "warn-text" : "muted";
    $("audit-older").disabled = !doc.next_before;
    $("audit-newest").disabled = view.cursors.length === 1;
  }
  async function refresh() {
    const seq = ++view.seq;
    try {
      const doc = await api("/audit?" + params());
      if (seq === view.seq) render(doc);
    } catch (err) { $("audit-status").textContent = err.message; $("audit-status").className = "err"; }
  }
  function restart() { view.cursors = [null]; refresh(); }
  $("audit-actor").addEventListener("change", restart);
  $("audit-action").addEventListener("change", restart);
  $("audit-newest").addEventListener("click", restart);
  $("audit-older").addEventListener("click", () => { if (view.doc && view.doc.next_before) { view.cursors.push(view.doc.next_before); refresh(); } });
  keyInput.addEventListener("change", restart);
  fillChoices();
  refresh();
  // Only the newest page follows new writes; an older page stays as it was read.
  setInterval(() => { if (view.cursors.length === 1) refresh(); }, 5000);
})();
