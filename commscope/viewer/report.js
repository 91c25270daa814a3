// commscope analysis report: renders the JSON embedded in #commscope-data.
// Offline and self-contained; every value from the data goes through textContent.
(function () {
  "use strict";

  var WORDS = {
    healthy: "nothing is stuck and every rank agrees",
    hang: "the job is stuck",
    desync: "ranks disagreed about a collective that still completed",
    crash: "a rank died or left no dump",
    incomplete: "the dumps cannot decide"
  };
  var SVG_NS = "http://www.w3.org/2000/svg";

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }

  function svg(tag, attrs) {
    var node = document.createElementNS(SVG_NS, tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    return node;
  }

  // a duration as the text report writes it (commscope/analyze/text.py: ms)
  function msText(value) {
    if (value >= 1000) { return (value / 1000).toFixed(1) + " s"; }
    return value >= 10 ? value.toFixed(0) + " ms" : value.toFixed(2) + " ms";
  }

  function rankText(list) {
    if (!list || !list.length) { return "none"; }
    var out = [], start = list[0], prev = list[0];
    for (var i = 1; i <= list.length; i++) {
      var r = list[i];
      if (r === prev + 1) { prev = r; continue; }
      out.push(start === prev ? String(start) : start + "-" + prev);
      start = prev = r;
    }
    return out.length > 12 ? out.slice(0, 12).join(", ") + ", ... (" + list.length + " ranks)" : out.join(", ");
  }

  // The answer first (commscope/analyze/answer.py): the verdict and its headline in the
  // banner, then the root cause, the other stuck places, what to do next and the notes.
  function header(app, data) {
    var a = data.analysis;
    var ans = a.answer || {};
    app.appendChild(el("h1", null, "commscope analysis"));
    app.appendChild(el("p", { "class": "sub" },
      (data.source || "") + " \u00b7 generated " + data.generated + " \u00b7 " + a.format));
    var box = el("div", { "class": "verdict " + a.verdict, id: "verdict" });
    box.appendChild(el("strong", null, a.verdict.toUpperCase()));
    var head = ans.headline || "";
    var colon = head.indexOf(": ");
    box.appendChild(el("span", { id: "headline" },
      colon >= 0 ? head.slice(colon + 2) : (WORDS[a.verdict] || "")));
    app.appendChild(box);
    lines(app, "Root cause", "root-cause", ans.root_cause);
    lines(app, "Where it is stuck", "stuck", ans.stuck);
    lines(app, "What to do next", "next", ans.next);
    lines(app, "Notes", "notes", ans.notes);
    var ranks = el("p", { "class": "ranks", id: "ranks" });
    ranks.appendChild(el("span", null, "expected: " + rankText(a.ranks.expected)));
    ranks.appendChild(el("span", null, "loaded: " + rankText(a.ranks.loaded)));
    ranks.appendChild(el("span", null, "missing: " + rankText(a.ranks.missing)));
    app.appendChild(ranks);
  }

  function lines(app, title, id, items) {
    if (!items || !items.length) { return; }
    var box = el("section", { "class": "answer", id: id + "-section" });
    box.appendChild(el("h2", null, title));
    var list = el("ul", { "class": "answer-list", id: id });
    items.forEach(function (line) { list.appendChild(el("li", null, line)); });
    box.appendChild(list);
    app.appendChild(box);
  }

  // Who waits for whom: an SVG drawn by the analyzer (commscope/analyze/present/waitsvg.py),
  // parsed as XML (never as HTML) and put in as it is; a section only where someone waits.
  function waitGraph(app, data) {
    var g = data.wait_graph;
    if (!g || !g.svg) { return; }
    var box = el("section", { id: "waitgraph" });
    box.appendChild(el("h2", null, "Who waits for whom"));
    var parsed = new DOMParser().parseFromString(g.svg, "image/svg+xml");
    var root = parsed.documentElement;
    if (root.localName !== "svg" || parsed.getElementsByTagName("parsererror").length) {
      box.appendChild(el("p", { "class": "empty" }, "the drawing could not be read"));
    } else {
      box.appendChild(document.importNode(root, true));
    }
    if (g.caption) { box.appendChild(el("p", { "class": "meta", id: "waitgraph-caption" }, g.caption)); }
    app.appendChild(box);
  }

  // Per group, who arrives last at its newest finished collectives and what the others
  // lose waiting; every group with a straggler, and the rest on request.
  function slowest(app, data) {
    var rows = data.analysis.slowest || [];
    if (!rows.length) { return; }
    var flat = rows.map(function (row) {
      return {
        group: row.group + " (#" + row.first_seq + "-#" + row.last_seq + ")",
        samples: row.samples,
        lost: (row.lost_share * 100).toFixed(1) + " %",
        ranks: row.ranks.map(function (x) {
          return "rank " + x.rank + (x.host && row.hosts.length ? " (" + x.host + ")" : "") +
            ": last " + x.last + "/" + row.samples + ", lag median " +
            msText(x.lag_median_ms) + ", p90 " + msText(x.lag_p90_ms) +
            (x.straggler ? " (straggler)" : "");
        }).join("; "),
        hosts: row.hosts.map(function (h) {
          var text = h.host + (h.ranks ? " (ranks " + h.ranks.join(", ") + ")" : "") +
            ": last " + h.last + "/" + row.samples;
          if (h.straggler) {
            text += ", lag median " + msText(h.lag_median_ms) + ", p90 " +
              msText(h.lag_p90_ms) + " (slow host)";
          }
          return text;
        }).join("; "),
        straggler: row.ranks.some(function (x) { return x.straggler; }) ||
          row.hosts.some(function (h) { return h.straggler; })
      };
    });
    var shown = flat.filter(function (r) { return r.straggler; });
    if (!shown.length) { return; }
    table(app, "Slowest ranks", "slowest", [
      ["group", "group"], ["samples", "collectives timed", true],
      ["lost", "time lost waiting", true], ["ranks", "last to arrive"], ["hosts", "by host"]
    ], shown, "");
  }

  function findings(app, data) {
    app.appendChild(el("h2", null, "Findings, root cause first"));
    var list = el("ol", { "class": "findings", id: "findings" });
    data.analysis.findings.forEach(function (f, i) {
      if (data.notes && data.notes[i]) { return; }  // told once, among the notes
      var item = el("li", { "class": i === 0 ? "root" : "" });
      item.appendChild(el("span", { "class": "kind" + (data.blocking[i] ? " blocking" : "") }, f.kind));
      item.appendChild(el("span", { "class": "message" }, f.message));
      var facts = [];
      if (f.group) {
        var label = (data.group_labels && data.group_labels[i]) || f.group.name;
        facts.push("group " + label + (f.group.desc ? " (" + f.group.desc + ")" : ""));
      }
      if (f.collective_seq_id !== null) { facts.push("#" + f.collective_seq_id); }
      if (f.op) { facts.push(f.op); }
      // with hosts when the job spans several ("3 (hostB, pid 4242)", "0-7 (all of hostA)")
      var named = data.finding_ranks ? data.finding_ranks[i] : null;
      if (f.culprit_ranks.length) {
        facts.push("culprits " + (named ? named.culprits : rankText(f.culprit_ranks)));
      }
      if (f.waiting_ranks.length) {
        facts.push("waiting " + (named ? named.waiting : rankText(f.waiting_ranks)));
      }
      if (f.victims && f.victims.length) {
        facts.push("victims " + (named ? named.victims : rankText(f.victims)));
      }
      if (facts.length) { item.appendChild(el("div", { "class": "meta" }, facts.join(" \u00b7 "))); }
      list.appendChild(item);
    });
    app.appendChild(list);
  }

  function table(app, title, id, columns, rows, empty) {
    app.appendChild(el("h2", null, title));
    if (!rows.length) { app.appendChild(el("p", { "class": "empty" }, empty)); return; }
    var t = el("table", { id: id });
    var head = el("tr");
    columns.forEach(function (c) { head.appendChild(el("th", null, c[1])); });
    t.appendChild(head);
    rows.forEach(function (row) {
      var tr = el("tr");
      columns.forEach(function (c) {
        tr.appendChild(el("td", c[2] ? { "class": "num" } : null, row[c[0]]));
      });
      t.appendChild(tr);
    });
    app.appendChild(t);
  }

  // Where every rank ran: one row per host (at scale the hosts with nothing to say are
  // counted, not listed), then the job told by host, then the hosts a restart leaves out.
  function hosts(app, data) {
    var h = data.hosts;
    if (!h) { return; }
    var box = el("section", { id: "hosts" });
    app.appendChild(box);
    box.appendChild(el("h2", null, "Hosts"));
    var t = el("table", { id: "hosts-table" });
    var head = el("tr");
    ["host", "ranks", "pids", "dumps here", "dump folder (on that host)", ""].forEach(function (c) {
      head.appendChild(el("th", null, c));
    });
    t.appendChild(head);
    h.rows.forEach(function (row) {
      var tr = el("tr", row.blamed ? { "class": "blamed" } : null);
      [row.host, row.ranks, row.pids || "-", row.dumps_here, row.dump_dir || "?", row.notes].forEach(
        function (v, i) { tr.appendChild(el("td", i === 3 ? { "class": "num" } : null, v)); });
      t.appendChild(tr);
    });
    box.appendChild(t);
    var more = [];
    if (h.more) { more.push(h.more + " more hosts with something to say (see --json: hosts)"); }
    if (h.quiet) {
      more.push(h.quiet + " more hosts (" + h.quiet_names + "): every dump here, nothing to report");
    }
    if (more.length) { box.appendChild(el("p", { "class": "meta", id: "hosts-folded" }, more.join("; "))); }
    if (h.by_host && h.by_host.length) {
      box.appendChild(el("h3", null, "By host"));
      var list = el("ul", { id: "by-host" });
      h.by_host.forEach(function (line) { list.appendChild(el("li", null, line)); });
      box.appendChild(list);
    }
    if (h.exclude && h.exclude.length) {
      box.appendChild(el("p", { id: "exclude-hosts" },
        "Leave out on restart: " + h.exclude.join(", ") + " (--json: exclude_hosts)"));
    }
  }

  function timeline(app, data) {
    app.appendChild(el("h2", null, "Timeline (newest records; red = stuck)"));
    var wrap = el("div", { id: "timeline" });
    app.appendChild(wrap);
    var tl = data.timeline;
    if (!tl.lanes.length) { wrap.appendChild(el("p", { "class": "empty" }, "no timed records")); return; }
    var start = Infinity;
    tl.lanes.forEach(function (lane) {
      lane.items.forEach(function (it) { start = Math.min(start, it[0]); });
    });
    var withHosts = tl.lanes.some(function (lane) { return lane.host; });
    var end = tl.span_us, labelW = withHosts ? 240 : 150, width = 1100, laneH = 18;
    var span = Math.max(end - start, 1);
    var height = tl.lanes.length * laneH + 10;
    var root = svg("svg", { viewBox: "0 0 " + width + " " + height, role: "img",
      "aria-label": "timeline of collectives per rank and group" });
    tl.lanes.forEach(function (lane, i) {
      var y = 5 + i * laneH;
      var label = svg("text", { x: 4, y: y + 12, "class": "lane-label" });
      label.textContent = "rank " + lane.rank + (lane.host ? " \u00b7 " + lane.host.slice(0, 14) : "") +
        " \u00b7 g " + lane.group;
      root.appendChild(label);
      lane.items.forEach(function (it) {
        var x = labelW + (it[0] - start) / span * (width - labelW - 6);
        var w = Math.max(1.5, it[1] / span * (width - labelW - 6));
        var rect = svg("rect", { x: x.toFixed(1), y: y + 2, width: w.toFixed(1), height: laneH - 5,
          "class": it[3] ? "stuck" : "ok" });
        var tip = svg("title", {});
        tip.textContent = it[2] + (it[3] ? " (stuck)" : "") + " \u00b7 " + it[1] + " \u00b5s";
        rect.appendChild(tip);
        root.appendChild(rect);
      });
    });
    wrap.appendChild(root);
  }

  function render() {
    var app = document.getElementById("app");
    var data = JSON.parse(document.getElementById("commscope-data").textContent);
    app.textContent = "";
    header(app, data);
    waitGraph(app, data);
    findings(app, data);
    slowest(app, data);
    hosts(app, data);
    table(app, "Groups", "groups", (data.group_columns || []).map(function (c) {
      return [c, c, c === "compared" || c === "mismatches"];
    }), data.groups, "no group recorded anything");
    (data.groups_after || []).forEach(function (line) {
      app.appendChild(el("p", { "class": "meta groups-after" }, line));
    });
    timeline(app, data);
    table(app, "Files not used as they are", "unreadable", [["file", "file"], ["error", "why"]],
      data.analysis.unreadable, "every file was read");
    if (data.analysis.other_jobs && data.analysis.other_jobs.length) {
      table(app, "Other jobs in this folder (not analyzed, never merged)", "other-jobs",
        [["file", "file"], ["reason", "why"]], data.analysis.other_jobs, "");
    }
    app.appendChild(el("p", { "class": "meta" }, "analyzed in " + data.elapsed_s + " s"));
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", render);
  } else {
    render();
  }
})();
