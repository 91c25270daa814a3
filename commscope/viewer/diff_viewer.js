/* commscope diff viewer.
 *
 * Reads the comparison of two comm traces that `commscope diff A B --html OUT` embeds in
 * <script id="diff-data" type="application/json"> (format commscope.comm.diff/1, every
 * row, unchanged ones included) and draws: the one-line summary, totals, net changes per
 * collective and axis, modules present in one trace only, every module side by side
 * (A | B | change, its own collectives) and every (module, phase, collective, axis) row,
 * biggest change first. Increases are red, decreases green, modules in one trace only
 * purple. Estimated times scale with the bandwidth box (est = bytes * factor / bw).
 * Plain DOM, no network, no framework.
 */
(function () {
  "use strict";

  var state = { data: null, bandwidth: 100, unchanged: false, query: "" };

  var $ = commscope.$;
  var el = commscope.el;
  var formatBytes = commscope.formatBytes;
  var formatUs = commscope.formatUs;

  function known(v) {
    return v !== null && v !== undefined;
  }

  /* ------------------------------------------------------------------ numbers */

  function bytesText(n) {
    return known(n) ? formatBytes(n) : "?";
  }

  function usText(us) {
    return known(us) ? formatUs(us) : "?";
  }

  function signedInt(n) {
    return n > 0 ? "+" + n : String(n);
  }

  function signedBytes(n) {
    if (!known(n)) return "?";
    if (n === 0) return "0 B";
    return (n > 0 ? "+" : "-") + formatBytes(Math.abs(n));
  }

  function signedUs(us) {
    if (!known(us)) return "?";
    if (Math.abs(us) < 5e-5) return "0 ns";
    return (us > 0 ? "+" : "-") + formatUs(Math.abs(us));
  }

  /* The dump's estimates are at data.bandwidth_gbps; time is inversely proportional. */
  function est(us) {
    if (!known(us)) return null;
    return (us * state.data.bandwidth_gbps) / state.bandwidth;
  }

  function sub(after, before) {
    return known(after) && known(before) ? after - before : null;
  }

  /* A time change below a femtosecond is summation noise: no change. */
  function subUs(after, before) {
    var d = sub(after, before);
    return known(d) && Math.abs(d) < 1e-9 ? 0 : d;
  }

  function direction(estDelta, bytesDelta, callsDelta) {
    var deltas = [estDelta, bytesDelta, callsDelta];
    for (var i = 0; i < deltas.length; i++) {
      if (known(deltas[i]) && deltas[i] !== 0) return deltas[i] > 0 ? 1 : -1;
    }
    return 0;
  }

  function rowClass(dir) {
    return dir > 0 ? "increase" : dir < 0 ? "decrease" : "same";
  }

  function deltaCell(kind, value, text) {
    var sign = !known(value) ? "unknown" : value > 0 ? "up" : value < 0 ? "down" : "zero";
    return el("td", { className: "num delta " + kind + "-delta " + sign, text: text });
  }

  /* Cells for A, B and the change of calls, bytes and estimated time. ``absent`` ("a" or
   * "b") marks the side whose trace does not have the module: its cells show a dash. */
  function sideCells(x, absent) {
    var estA = est(x.est_us_before);
    var estB = est(x.est_us_after);
    var bytesDelta = sub(x.bytes_after, x.bytes_before);
    function cell(side, kind, text) {
      var gone = absent === side;
      return el("td", {
        className: "num " + side + " " + kind + "-" + side + (gone ? " absent" : ""),
        text: gone ? "\u2013" : text,
        title: gone ? "no such module in " + side.toUpperCase() : null,
      });
    }
    return [
      cell("a", "calls", x.calls_before),
      cell("a", "bytes", bytesText(x.bytes_before)),
      cell("a", "est", usText(estA)),
      cell("b", "calls", x.calls_after),
      cell("b", "bytes", bytesText(x.bytes_after)),
      cell("b", "est", usText(estB)),
      deltaCell("calls", x.calls_after - x.calls_before, signedInt(x.calls_after - x.calls_before)),
      deltaCell("bytes", bytesDelta, signedBytes(bytesDelta)),
      deltaCell("est", subUs(estB, estA), signedUs(subUs(estB, estA))),
    ];
  }

  function groupHeader(keys) {
    var first = el("tr", null, keys.map(function (k) {
      return el("th", { rowspan: 2, text: k });
    }).concat([
      el("th", { colspan: 3, className: "side-a a", text: "A" }),
      el("th", { colspan: 3, className: "side-b", text: "B" }),
      el("th", { colspan: 3, className: "side-d", text: "change" }),
    ]));
    var names = ["calls", "bytes", "est. time"];
    var second = el("tr", null, [].concat(
      names.map(function (n) { return el("th", { className: "num a", text: n }); }),
      names.map(function (n) { return el("th", { className: "num", text: n }); }),
      names.map(function (n) { return el("th", { className: "num", text: n }); })
    ));
    return el("thead", null, [first, second]);
  }

  /* ------------------------------------------------------------------ sections */

  function sideText(side) {
    var parts = [side.has_bytes ? side.source : "PyTorch dump: counts only"];
    if (known(side.rank)) parts.push("rank " + side.rank + (side.world_size ? " of " + side.world_size : ""));
    if (side.torch_version) parts.push("torch " + side.torch_version);
    return side.label + " (" + parts.join(", ") + ")";
  }

  function renderMeta(data) {
    var meta = $("meta");
    meta.textContent = "";
    meta.appendChild(el("span", { className: "side side-a", text: "A: " + sideText(data.a) }));
    meta.appendChild(el("span", { className: "side side-b", text: "B: " + sideText(data.b) }));
    $("summary-line").textContent = "A \u2192 B: " + data.summary;
  }

  function renderTotals(data) {
    var t = data.totals;
    var estA = est(t.est_us_before);
    var estB = est(t.est_us_after);
    var measures = [
      ["calls", t.calls_before, t.calls_after, t.calls_after - t.calls_before, String, signedInt],
      ["bytes", t.bytes_before, t.bytes_after, sub(t.bytes_after, t.bytes_before), bytesText, signedBytes],
      ["est", estA, estB, subUs(estB, estA), usText, signedUs],
    ];
    var titles = { calls: "calls", bytes: "bytes", est: "est. time @ " + state.bandwidth + " GB/s" };
    var rows = measures.map(function (m) {
      return el("tr", { "data-measure": m[0] }, [
        el("th", { text: titles[m[0]] }),
        el("td", { className: "num a", text: m[4](m[1]) }),
        el("td", { className: "num b", text: m[4](m[2]) }),
        deltaCell(m[0], m[3], m[5](m[3])),
      ]);
    });
    var head = el("tr", null, [el("th"), el("th", { className: "num a", text: "A" }),
      el("th", { className: "num", text: "B" }), el("th", { className: "num", text: "change" })]);
    var table = el("table", { id: "totals" }, [el("thead", null, [head]), el("tbody", null, rows)]);
    replaceTable("totals-box", table);
  }

  function renderNet(data) {
    var rows = data.net.map(function (n) {
      var dir = n.direction;
      return el("tr", {
        className: "net " + rowClass(dir),
        "data-collective": n.collective,
        "data-axis": known(n.axis) ? n.axis : "-",
      }, [
        el("td", { className: "key", text: n.collective }),
        el("td", { className: "axis", text: known(n.axis) ? n.axis : "-" }),
      ].concat(sideCells(n)));
    });
    var table = el("table", { id: "net" }, [groupHeader(["collective", "axis"]), el("tbody", null, rows)]);
    replaceTable("net-box", table);
  }

  function renderOnly(data) {
    var box = $("only-box");
    while (box.childNodes.length > 1) box.removeChild(box.lastChild);
    [["a", "only in A", data.only_in_a], ["b", "only in B", data.only_in_b]].forEach(function (s) {
      var items = s[2].map(function (fqn) { return el("li", { text: fqn }); });
      box.appendChild(el("div", { className: "only only-" + s[0] }, [
        el("strong", { text: s[1] + " (" + s[2].length + ")" }),
        items.length ? el("ul", { className: "only-list", id: "only-in-" + s[0] }, items)
          : el("div", { className: "empty", text: "none" }),
      ]));
    });
  }

  function moduleTotals(data) {
    var out = {};
    data.rows.forEach(function (r) {
      var m = out[r.module] || (out[r.module] = {
        calls_before: 0, calls_after: 0,
        bytes_before: data.a.has_bytes ? 0 : null, bytes_after: data.b.has_bytes ? 0 : null,
        est_us_before: data.a.has_bytes ? 0 : null, est_us_after: data.b.has_bytes ? 0 : null,
      });
      ["calls_before", "calls_after", "bytes_before", "bytes_after", "est_us_before",
       "est_us_after"].forEach(function (k) {
        if (known(m[k]) && known(r[k])) m[k] += r[k];
      });
    });
    return out;
  }

  function renderModules(data) {
    var totals = moduleTotals(data);
    var onlyA = new Set(data.only_in_a);
    var onlyB = new Set(data.only_in_b);
    var empty = {
      calls_before: 0, calls_after: 0,
      bytes_before: data.a.has_bytes ? 0 : null, bytes_after: data.b.has_bytes ? 0 : null,
      est_us_before: data.a.has_bytes ? 0 : null, est_us_after: data.b.has_bytes ? 0 : null,
    };
    var rows = data.module_order.map(function (pair) {
      var fqn = pair[0];
      var m = totals[fqn] || empty;
      var dir = direction(subUs(m.est_us_after, m.est_us_before), sub(m.bytes_after, m.bytes_before),
                          m.calls_after - m.calls_before);
      var cls = "module " + rowClass(dir);
      var tag = null;
      var absent = null;
      if (onlyA.has(fqn)) {
        cls += " only-a";
        absent = "b";
        tag = el("span", { className: "tag only", text: "only in A" });
      }
      if (onlyB.has(fqn)) {
        cls += " only-b";
        absent = "a";
        tag = el("span", { className: "tag only", text: "only in B" });
      }
      return el("tr", { className: cls, "data-fqn": fqn, "data-module": fqn }, [
        el("td", { className: "key mono", style: "padding-left:" + (8 + 14 * pair[1]) + "px" },
           [fqn, tag]),
      ].concat(sideCells(m, absent)));
    });
    var table = el("table", { id: "modules" }, [groupHeader(["module"]), el("tbody", null, rows)]);
    replaceTable("modules-box", table);
  }

  function renderRows(data) {
    var rows = data.rows.map(function (r) {
      var dir = r.direction;
      var cls = "row " + rowClass(dir);
      var tag = null;
      if (r.calls_before === 0 && r.calls_after > 0) { cls += " added"; tag = el("span", { className: "tag added", text: "new" }); }
      if (r.calls_after === 0 && r.calls_before > 0) { cls += " removed"; tag = el("span", { className: "tag removed", text: "gone" }); }
      var axis = known(r.axis) ? r.axis : "-";
      return el("tr", {
        className: cls,
        "data-module": r.module,
        "data-phase": r.phase,
        "data-collective": r.collective,
        "data-axis": axis,
      }, [
        el("td", { className: "key mono", text: r.module }),
        el("td", { className: "phase", text: r.phase }),
        el("td", { className: "collective" }, [r.collective, tag]),
        el("td", { className: "axis", text: axis }),
      ].concat(sideCells(r)));
    });
    var table = el("table", { id: "rows" },
                   [groupHeader(["module", "phase", "collective", "axis"]), el("tbody", null, rows)]);
    replaceTable("rows-box", table);
  }

  function replaceTable(boxId, table) {
    var box = $(boxId);
    var old = box.querySelector("table");
    if (old) box.replaceChild(table, old);
    else box.appendChild(table);
  }

  /* Unchanged rows and modules are hidden unless asked; the search box filters modules. */
  function applyFilters() {
    var q = state.query.toLowerCase();
    document.querySelectorAll("#modules tr.module, #rows tr.row").forEach(function (tr) {
      var name = (tr.getAttribute("data-module") || "").toLowerCase();
      var quiet = tr.classList.contains("same") && !tr.classList.contains("only-a")
        && !tr.classList.contains("only-b");
      var hide = (quiet && !state.unchanged) || (q && name.indexOf(q) < 0);
      tr.classList.toggle("hidden", Boolean(hide));
    });
    var shown = document.querySelectorAll("#rows tr.row:not(.hidden)").length;
    var note = $("rows-empty");
    if (!shown && !note) {
      $("rows-box").appendChild(el("div", { id: "rows-empty", className: "empty",
        text: "no row to show (tick \u201cshow unchanged\u201d or clear the filter)" }));
    } else if (shown && note) {
      note.parentNode.removeChild(note);
    }
  }

  function render() {
    var data = state.data;
    renderTotals(data);
    renderNet(data);
    renderModules(data);
    renderRows(data);
    applyFilters();
  }

  function load() {
    var raw = $("diff-data").textContent;
    var data = null;
    try {
      data = JSON.parse(raw);
    } catch (e) {
      data = null;
    }
    if (!data || data.schema !== "commscope.comm.diff") {
      var box = $("error");
      box.textContent = "No comparison is embedded in this page: write one with " +
        "`commscope diff A.json B.json --html OUT.html`.";
      box.hidden = false;
      document.body.setAttribute("data-loaded", "true");
      return;
    }
    state.data = data;
    state.bandwidth = Number(data.bandwidth_gbps) || 100;
    $("bandwidth").value = String(state.bandwidth);
    renderMeta(data);
    renderOnly(data);
    render();
    document.body.setAttribute("data-loaded", "true");
  }

  $("bandwidth").addEventListener("input", function (event) {
    var value = Number(event.target.value);
    if (!state.data || !(value > 0)) return;
    state.bandwidth = value;
    render();
  });
  $("show-unchanged").addEventListener("change", function (event) {
    state.unchanged = event.target.checked;
    applyFilters();
  });
  $("search").addEventListener("input", function (event) {
    state.query = event.target.value.trim();
    applyFilters();
  });
  load();
})();
