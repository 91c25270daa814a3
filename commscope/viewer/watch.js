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

  // The ranks table comes drawn by the server (commscope.watch.view.rank_table), as the
  // terminal shows it: host and pid columns when the job spans hosts, folded by host at
  // scale. Only put into cells, as text.
  function rankRows(snap) {
    return snap.rank_table || { columns: [], rows: [], caption: "", hosts: 0 };
  }

  // Who waits for whom: the SVG the server drew from the snapshot's wait_graph (the same
  // drawing as the HTML report's), parsed as XML, never as HTML.
  function waitGraph(snap) {
    var box = el("section", { id: "waitgraph" });
    box.appendChild(el("h2", {}, "Who waits for whom"));
    var parsed = new DOMParser().parseFromString(snap.wait_graph_svg, "image/svg+xml");
    var root = parsed.documentElement;
    if (root.localName !== "svg" || parsed.getElementsByTagName("parsererror").length) {
      box.appendChild(el("p", { "class": "empty" }, "the drawing could not be read"));
    } else {
      box.appendChild(document.importNode(root, true));
    }
    var caption = snap.wait_graph && snap.wait_graph.caption;
    if (caption) box.appendChild(el("p", { "class": "meta", id: "waitgraph-caption" }, caption));
    return box;
  }

  function slowestPanel(snap) {
    return table("slowest", "Slowest ranks (who arrives last at each group's newest collectives)",
      [["group", "group"], ["window", "window"], ["lost", "time lost waiting"], ["slowest", "slowest"]],
      snap.slowest_table.map(function (r) {
        return { group: r.group, window: r.window, lost: r.lost, slowest: r.slowest,
          _class: r.straggler ? "straggler" : "" };
      }), "");
  }

  function desyncList(snap) {
    var sec = el("section", { id: "desyncs" });
    sec.appendChild(el("h2", {}, "Silent desyncs (the ranks' running fingerprints differ)"));
    var ol = el("ol");
    snap.desyncs.forEach(function (f) {
      var li = el("li");
      li.appendChild(el("span", { "class": "kind" }, f.kind));
      li.appendChild(el("span", { "class": "message" }, " " + f.message));
      ol.appendChild(li);
    });
    sec.appendChild(ol);
    return sec;
  }

  function draw(snap) {
    app.textContent = "";
    var head = el("header", { id: "verdict", "class": "state-" + (snap.state || "waiting") });
    head.appendChild(el("strong", {}, (snap.state || "waiting").toUpperCase()));
    head.appendChild(el("span", { id: "headline" }, " " + (snap.headline || "")));
    app.appendChild(head);
    var ranks = rankRows(snap);
    var meta = el("p", { "class": "meta" },
      "store " + snap.store + " · " + snap.world_size + " ranks" +
      (ranks.hosts > 1 ? " on " + ranks.hosts + " hosts" : "") + " · records every " +
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
    if ((snap.desyncs || []).length) app.appendChild(desyncList(snap));
    if (snap.wait_graph_svg) app.appendChild(waitGraph(snap));
    app.appendChild(table("groups", "Groups", [["name", "group"], ["desc", "desc"], ["ranks", "ranks"],
      ["enqueued_max", "enqueued"], ["completed_min", "completed (min)"], ["lag", "lag"], ["behind", "behind"]],
      (snap.groups || []).slice(0, 200).map(function (g) {
        var b = Object.keys(g.behind).slice(0, 8).map(function (r) { return r + " (-" + g.behind[r] + ")"; });
        return { name: g.name.slice(0, 12), desc: g.desc, ranks: g.ranks, enqueued_max: g.enqueued_max,
          completed_min: g.completed_min, lag: g.lag || "-", behind: b.join(", ") || "-" };
      }), "no group has published progress yet"));
    if ((snap.slowest_table || []).length) app.appendChild(slowestPanel(snap));
    var rt = table("ranks", "Ranks (the ones that matter first)", ranks.columns, ranks.rows,
      "no rank has published yet");
    if (ranks.caption) rt.appendChild(el("p", { "class": "meta", id: "ranks-caption" }, ranks.caption));
    app.appendChild(rt);
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
