// cairn's web page: keeps the tables up to date from the JSON API
// (doc/api.md) every few seconds. Text goes in with textContent only, so
// no name from the realm is ever read as HTML.
"use strict";
(function () {
  const poll = 5000;
  function human(n) {
    if (n < 1024) return n + " B";
    const u = "KMGTPE"; let i = -1;
    do { n /= 1024; i++; } while (n >= 1024 && i < u.length - 1);
    return n.toFixed(1) + " " + u[i] + "iB";
  }
  function when(t) { return t ? t.replace("T", " ").replace(/\.\d+/, "") : "never"; }
  function fill(tbody, rows, empty) {
    tbody.replaceChildren();
    if (rows.length === 0 && empty) {
      const td = document.createElement("td");
      td.colSpan = tbody.parentElement.querySelectorAll("th").length;
      td.textContent = empty;
      tbody.appendChild(document.createElement("tr")).appendChild(td);
      return;
    }
    for (const cells of rows) {
      const tr = document.createElement("tr");
      for (const c of cells) {
        const td = document.createElement("td");
        if (c instanceof Node) td.appendChild(c); else td.textContent = c;
        tr.appendChild(td);
      }
      tbody.appendChild(tr);
    }
  }
  function section(id) { return document.querySelector("#" + id + " tbody"); }
  async function get(path) {
    // From the origin: a page opened as http://user:pass@host/ would
    // otherwise give fetch a URL with credentials, which it refuses.
    const r = await fetch(location.origin + path, { credentials: "same-origin", headers: { Accept: "application/json" } });
    const body = await r.json();
    if (!r.ok) throw new Error(body.error || r.statusText);
    return body;
  }
  // post sends a JSON body: the only requests that change the realm
  // (POST /api/v1/restore), refused by the server from any other origin.
  async function post(path, body) {
    const r = await fetch(location.origin + path, { method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json" }, body: JSON.stringify(body) });
    const b = await r.json();
    if (!r.ok) throw new Error(b.error || r.statusText);
    return b;
  }
  function button(label, onclick) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = label;
    b.addEventListener("click", onclick);
    return b;
  }
  function link(label, href) {
    const a = document.createElement("a");
    a.textContent = label;
    a.href = href;
    return a;
  }
  // action runs a restore, then says what it did (or why not) and shows
  // the list again.
  function action(err, formId, body) {
    return async () => {
      const out = document.getElementById(err);
      try {
        const res = await post("/api/v1/restore", body);
        out.textContent = "restored " + res.path + (res.version ? " as version " + res.version : "");
        document.getElementById(formId).requestSubmit();
      } catch (e) {
        out.textContent = e.message;
      }
    };
  }
  async function refresh() {
    try {
      const st = await get("/api/v1/status");
      const ul = document.getElementById("problems-list");
      ul.replaceChildren();
      for (const p of st.problems.length ? st.problems : [{ what: "none", detail: "" }]) {
        const li = document.createElement("li");
        const b = document.createElement("strong");
        b.textContent = p.what;
        li.append(b, p.detail ? ": " + p.detail : "");
        ul.appendChild(li);
      }
      const ds = await get("/api/v1/devices");
      fill(section("devices"), ds.map(d => [d.name, d.role, d.state, when(d.since || d.registered), when(d.last_seen),
        d.capacity ? human(d.free) : "-", d.capacity ? human(d.used) : "-", human(Math.round(d.rate)) + "/s",
        d.wake && d.wake.mac ? "wake-on-lan " + d.wake.mac + (d.wake.proxy ? " by " + d.wake.proxy : "") : "-"]));
      const w = await get("/api/v1/work");
      document.getElementById("queue").textContent = "Upload queue: " + w.queue.files + " file(s), " + human(w.queue.bytes) +
        (w.queue.draining ? ", uploading now" : "");
      fill(section("work"), w.mounts.map(m => [m.mountpoint, m.volume, m.mode, m.pending, m.closed, m.queued, m.namespace,
        m.commits_done, m.commits_failed]), "no mounts running on this device");
      const ss = await get("/api/v1/stores");
      fill(section("stores"), ss.map(s => [s.name, s.url, s.health + (s.draining ? ", draining" : ""), s.objects, human(s.bytes),
        Object.values(s.requests || {}).reduce((a, b) => a + b, 0), s.price ? "$" + s.monthly_storage_cost.toFixed(4) : "-"]), "no stores registered: data lives in each device's own store");
      const vs = await get("/api/v1/volumes");
      fill(section("volumes"), vs.map(v => [v.name, v.files, v.dirs, human(v.bytes), v.keep_versions + " versions",
        v.policies.length ? v.policies.map(p => p.path + ": " + p.policy).join("; ") : "default (this device)"]));
      document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    } catch (e) {
      document.getElementById("updated").textContent = "cannot update: " + e.message;
    }
  }
  function form(id, path, body, err, rows) {
    document.getElementById(id).addEventListener("submit", async ev => {
      ev.preventDefault();
      const q = new URLSearchParams(new FormData(ev.target));
      document.getElementById(err).textContent = "";
      try {
        fill(document.getElementById(body), rows(await get(path + "?" + q), q));
      } catch (e) {
        document.getElementById(err).textContent = e.message;
      }
    });
  }
  form("versions-form", "/api/v1/versions", "versions-body", "versions-error",
    (vs, q) => vs.slice().reverse().map(v => {
      const vol = q.get("vol"), path = q.get("path"), acts = document.createElement("span");
      acts.appendChild(link("download", "/api/v1/download?" + new URLSearchParams({ vol: vol, path: path, version: v.n })));
      if (!v.current) acts.append(" ", button("restore", action("versions-error", "versions-form", { vol: vol, path: path, version: v.n })));
      return [v.n + (v.current ? " (current)" : ""), human(v.size), when(v.mtime), when(v.committed), v.stores.join(", "), acts];
    }), "no versions");
  form("trash-form", "/api/v1/trash", "trash-body", "trash-error",
    (ts, q) => ts.map(t => {
      const vol = q.get("vol"), path = t.path.slice(t.path.indexOf(":") + 1);
      return [when(t.deleted), when(t.expires), human(t.size), t.path,
        button("restore", action("trash-error", "trash-form", { vol: vol, path: path, from_trash: true }))];
    }), "the trash is empty");
  setInterval(refresh, poll);
})();
