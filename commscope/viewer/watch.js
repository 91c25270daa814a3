// commscope watch --web: polls /snapshot.json and draws the live view. Data is only
// ever put into the page as text (textContent), never as markup.
(function () {
  "use strict";
  var token = new URLSearchParams(window.location.search).get("token") || "";
  var q = "?token=" + encodeURIComponent(token);
  var app = document.getElementById("app");

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function table(id, title, columns, rows, empty) {
    var box = el("section", { id: id });
    box.appendChild(el("h2", {}, title));
    if (!rows.length) { box.appendChild(el("p", { "class": "empty" }, empty)); return box; }
    var t = el("table"), head = el("tr");
    columns.forEach(function (c) { head.appendChild(el("th", {}, c[1])); });
    t.appendChild(head);
    rows.forEach(function (r) {
      var tr = el("tr", r._class ? { "class": r._class } : {});
      columns.forEach(function (c) { tr.appendChild(el("td", {}, r[c[0]])); });
      t.appendChild(tr);
    });
    box.appendChild(t);
    return box;
  }

  function interesting(snap, max) {
    var named = {};
    snap.findings.forEach(function (f) { f.culprit_ranks.forEach(function (r) { named[r] = 1; }); });
    var rows = snap.ranks.slice();
    rows.sort(function (a, b) {
      var wa = a.oldest_unfinished ? a.oldest_unfinished.age_s : -1;
      var wb = b.oldest_unfinished ? b.oldest_unfinished.age_s : -1;
      return ((named[b.rank] || 0) - (named[a.rank] || 0)) || ((b.silent ? 1 : 0) - (a.silent ? 1 : 0)) ||
        (wb - wa) || (a.rank - b.rank);
    });
    rows = rows.slice(0, max);
    rows.sort(function (a, b) { return a.rank - b.rank; });
    return rows.map(function (r) {
      var o = r.oldest_unfinished;
      return {
        rank: r.rank, step: r.step === null ? "-" : r.step,
        age: r.silent ? "silent" : (r.age_s === null ? "?" : r.age_s.toFixed(1) + " s"),
        op: o ? o.op + " of " + o.group.slice(0, 12) : "-",
        wait: o ? o.age_s.toFixed(1) + " s" : "-",
        where: (o ? o.where : r.where_now) || "-",
        _class: named[r.rank] ? "culprit" : (r.silent ? "silent" : "")
      };
    });
  }

  function draw(snap) {
    app.textContent = "";
    var head = el("header", { id: "verdict", "class": "state-" + (snap.state || "waiting") });
    head.appendChild(el("strong", {}, (snap.state || "waiting").toUpperCase()));
    head.appendChild(el("span", { id: "headline" }, " " + (snap.headline || "")));
    app.appendChild(head);
    var meta = el("p", { "class": "meta" },
      "store " + snap.store + " · " + snap.world_size + " ranks · records every " +
      snap.interval_s + " s · stuck after " + snap.stall_s + " s · ");
    var link = el("a", { href: "/report" + q, id: "report-link" }, "HTML report of the last dump");
    meta.appendChild(link);
    app.appendChild(meta);
    var fl = el("section", { id: "findings" });
    fl.appendChild(el("h2", {}, "Why (same analysis as commscope analyze)"));
    var ol = el("ol");
    (snap.findings || []).forEach(function (f) {
      var li = el("li");
      li.appendChild(el("span", { "class": "kind" }, f.kind));
      li.appendChild(el("span", { "class": "message" }, " " + f.message));
      ol.appendChild(li);
    });
    if (!(snap.findings || []).length) fl.appendChild(el("p", { "class": "empty" }, "nothing stuck"));
    else fl.appendChild(ol);
    app.appendChild(fl);
    app.appendChild(table("groups", "Groups", [["name", "group"], ["desc", "desc"], ["ranks", "ranks"],
      ["enqueued_max", "enqueued"], ["completed_min", "completed (min)"], ["lag", "lag"], ["behind", "behind"]],
      (snap.groups || []).slice(0, 200).map(function (g) {
        var b = Object.keys(g.behind).slice(0, 8).map(function (r) { return r + " (-" + g.behind[r] + ")"; });
        return { name: g.name.slice(0, 12), desc: g.desc, ranks: g.ranks, enqueued_max: g.enqueued_max,
          completed_min: g.completed_min, lag: g.lag || "-", behind: b.join(", ") || "-" };
      }), "no group has published progress yet"));
    app.appendChild(table("ranks", "Ranks (the ones that matter first)", [["rank", "rank"], ["step", "step"],
      ["age", "record age"], ["op", "oldest unfinished"], ["wait", "waiting"], ["where", "where"]],
      interesting(snap, 32), "no rank has published yet"));
    if (snap.error) app.appendChild(el("p", { "class": "error", id: "error" }, snap.error));
  }

  var period = 1000;
  function tick() {
    fetch("/snapshot.json" + q, { cache: "no-store" }).then(function (r) {
      if (!r.ok) throw new Error("HTTP " + r.status);
      return r.json();
    }).then(function (snap) {
      draw(snap);
      if (snap.interval_s) period = Math.max(500, Math.min(5000, snap.interval_s * 500));
    }).catch(function (e) {
      var s = document.getElementById("status") || app.appendChild(el("p", { id: "status" }));
      s.textContent = "cannot reach commscope watch: " + e.message;
    }).finally(function () { setTimeout(tick, period); });
  }
  tick();
})();
