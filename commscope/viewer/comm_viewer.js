/* commscope comm-trace viewer.
 *
 * Reads a CommDebugMode JSON dump (commscope's, or PyTorch's: same node keys) embedded in
 * <script id="comm-data" type="application/json">, or dropped / picked by the user, and
 * draws the module tree: per module its forward / backward collectives (counts, and with
 * commscope dumps bytes, mesh axis and estimated time), parameters and their sharding,
 * and the op lists present at noise level >= 1. Plain DOM, no network, no framework.
 */
(function () {
  "use strict";

  var PHASES = [
    ["forward", "Forward pass"],
    ["backward", "Backward pass"],
    ["after_backward", "After backward"],
  ];
  var OP_PHASES = [
    ["forward", "Forward ops"],
    ["backward", "Backward ops"],
    ["checkpointing", "Activation checkpointing ops"],
    ["after_backward", "After-backward ops"],
  ];

  var state = { data: null, bandwidth: 100 };

  var $ = commscope.$;
  var el = commscope.el;
  var formatBytes = commscope.formatBytes;
  var formatUs = commscope.formatUs;

  function estimateUs(bytes, factor) {
    if (!state.bandwidth || state.bandwidth <= 0 || factor === undefined) return null;
    return (Number(bytes) * Number(factor)) / (state.bandwidth * 1e9) * 1e6;
  }

  function showError(message) {
    var box = $("error");
    box.textContent = message;
    box.hidden = !message;
  }

  function pairs(list) {
    return Array.isArray(list) ? list : [];
  }

  function total(list) {
    return pairs(list).reduce(function (sum, pair) {
      return sum + (Number(pair[1]) || 0);
    }, 0);
  }

  /* ------------------------------------------------------------------ tables */

  function table(headers, rows, attrs) {
    var head = el("tr", null, headers.map(function (h) {
      return el("th", { text: h[0], className: h[1] || null });
    }));
    return el("table", attrs, [el("thead", null, [head]), el("tbody", null, rows)]);
  }

  function estCell(bytes, factor) {
    return el("td", {
      className: "num est",
      "data-bytes": bytes,
      "data-factor": factor,
      text: formatUs(estimateUs(bytes, factor)),
    });
  }

  function collectiveTable(node, phase) {
    var counts = pairs(node["collectives_" + phase]);
    var stats = node.collective_stats && node.collective_stats[phase];
    if (!counts.length && !(stats && stats.length)) return null;
    var rows;
    var headers;
    if (stats && stats.length) {
      headers = [["Collective"], ["Op key"], ["Count", "num"], ["Bytes", "num"], ["Axis"],
                 ["Ranks", "num"], ["Est. time", "num"]];
      rows = stats.map(function (s) {
        return el("tr", { "data-key": s.key, "data-collective": s.collective }, [
          el("td", { text: s.collective }),
          el("td", { className: "mono", text: s.key }),
          el("td", { className: "num count", text: s.count }),
          el("td", { className: "num bytes", text: formatBytes(s.bytes), title: s.bytes + " bytes" }),
          el("td", { className: "axis", text: s.axis === null || s.axis === undefined ? "-" : s.axis }),
          el("td", { className: "num", text: s.group_size || "?" }),
          estCell(s.bytes, s.busbw_factor),
        ]);
      });
    } else {
      headers = [["Collective"], ["Count", "num"]];
      rows = counts.map(function (pair) {
        return el("tr", { "data-key": pair[0] }, [
          el("td", { className: "mono", text: pair[0] }),
          el("td", { className: "num count", text: pair[1] }),
        ]);
      });
    }
    return table(headers, rows, { className: "collectives", "data-phase": phase });
  }

  function opsBlock(node, phase, title) {
    var ops = pairs(node["operations_" + phase]);
    if (!ops.length) return null;
    var rows = ops.map(function (op) {
      return el("tr", null, [
        el("td", { className: "mono", text: op.name }),
        el("td", { className: "mono", text: pairs(op.input_shape).join(", ") }),
        el("td", { className: "mono", text: pairs(op.input_sharding).join(", ") }),
        el("td", { className: "mono", text: op.device_mesh || "" }),
      ]);
    });
    var details = el("details", { className: "ops", "data-phase": phase }, [
      el("summary", { text: title + " (" + ops.length + ")" }),
      table([["Operation"], ["Input shape"], ["Input sharding"], ["Device mesh"]], rows),
    ]);
    return details;
  }

  function parameterTable(node) {
    var details = pairs(node.parameter_details);
    if (details.length) {
      return table(
        [["Parameter"], ["Shape"], ["Local shape"], ["Dtype"], ["Sharding"], ["Mesh"]],
        details.map(function (p) {
          return el("tr", { "data-param": p.name }, [
            el("td", { className: "mono", text: p.name }),
            el("td", { className: "mono", text: "[" + pairs(p.shape).join(", ") + "]" }),
            el("td", { className: "mono", text: "[" + pairs(p.local_shape).join(", ") + "]" }),
            el("td", { text: p.dtype || "" }),
            el("td", { className: "mono sharding", text: p.placements || "(plain tensor)" }),
            el("td", { className: "mono", text: p.mesh || "" }),
          ]);
        }),
        { className: "parameters" }
      );
    }
    var plain = pairs(node.parameters);
    if (!plain.length) return null;
    return table([["Parameter"], ["Sharding"]], plain.map(function (p) {
      return el("tr", { "data-param": p[0] }, [
        el("td", { className: "mono", text: p[0] }),
        el("td", { className: "mono sharding", text: p[1] }),
      ]);
    }), { className: "parameters" });
  }

  /* ------------------------------------------------------------------ tree */

  function nodeBytes(node) {
    var stats = node.collective_stats;
    if (!stats) return null;
    var sum = 0;
    PHASES.forEach(function (p) {
      pairs(stats[p[0]]).forEach(function (s) { sum += Number(s.bytes) || 0; });
    });
    return sum;
  }

  function renderNode(node, depth) {
    var li = el("li", { className: "node", role: "treeitem", "data-fqn": node.fqn });
    var toggle = el("button", {
      type: "button",
      className: "node-toggle",
      "aria-label": "expand " + node.fqn,
    });
    var fwd = total(node.collectives_forward);
    var bwd = total(node.collectives_backward);
    var after = total(node.collectives_after_backward);
    var bytes = nodeBytes(node);
    var head = el("div", { className: "head" }, [
      toggle,
      el("span", { className: "node-name", text: node.fqn }),
      fwd ? el("span", { className: "badge fwd", title: "forward collectives", text: "fwd " + fwd }) : null,
      bwd ? el("span", { className: "badge bwd", title: "backward collectives", text: "bwd " + bwd }) : null,
      after ? el("span", { className: "badge after", title: "collectives after backward", text: "after bwd " + after }) : null,
      bytes ? el("span", { className: "badge", title: "bytes moved", text: formatBytes(bytes) }) : null,
    ]);
    var body = el("div", { className: "body" });
    var type = node.module_class || node.module_type;
    if (type) body.appendChild(el("div", { className: "type mono", text: type }));
    var params = parameterTable(node);
    if (params) body.appendChild(el("div", { className: "section parameters" }, [el("h3", { text: "Parameters" }), params]));
    PHASES.forEach(function (p) {
      var t = collectiveTable(node, p[0]);
      if (t) body.appendChild(el("div", { className: "section " + p[0] }, [el("h3", { text: p[1] }), t]));
    });
    OP_PHASES.forEach(function (p) {
      var block = opsBlock(node, p[0], p[1]);
      if (block) body.appendChild(el("div", { className: "section " + p[0] }, [block]));
    });
    if (!body.childNodes.length) body.appendChild(el("div", { className: "empty", text: "no collectives" }));
    li.appendChild(head);
    li.appendChild(body);
    var kids = pairs(node.children);
    if (kids.length) {
      var ul = el("ul", { className: "children", role: "group" });
      kids.forEach(function (child) { ul.appendChild(renderNode(child, depth + 1)); });
      li.appendChild(ul);
    }
    if (depth < 2) li.classList.add("open");
    var flip = function () {
      li.classList.toggle("open");
      toggle.setAttribute("aria-expanded", li.classList.contains("open") ? "true" : "false");
    };
    toggle.addEventListener("click", flip);
    head.querySelector(".node-name").addEventListener("click", flip);
    return li;
  }

  /* ------------------------------------------------------------------ summary */

  function renderSummary(data) {
    var box = $("summary");
    box.textContent = "";
    var meta = data.commscope;
    var rows = [];
    if (meta && Array.isArray(meta.records)) {
      var groups = {};
      var order = [];
      meta.records.forEach(function (r) {
        var key = r.collective + "|" + r.axis + "|" + r.group_size;
        if (!groups[key]) {
          groups[key] = { collective: r.collective, axis: r.axis, ranks: r.group_size,
                          calls: 0, forward: 0, backward: 0, after_backward: 0, bytes: 0, factorBytes: 0 };
          order.push(key);
        }
        var g = groups[key];
        g.calls += 1;
        g[r.phase] = (g[r.phase] || 0) + 1;
        g.bytes += Number(r.bytes) || 0;
      });
      // bus-bandwidth factor per row, from the per-node stats of the root
      var factors = {};
      PHASES.forEach(function (p) {
        pairs(data.collective_stats && data.collective_stats[p[0]]).forEach(function (s) {
          factors[s.collective + "|" + s.axis + "|" + s.group_size] = s.busbw_factor;
        });
      });
      rows = order.map(function (key) {
        var g = groups[key];
        return el("tr", { "data-collective": g.collective }, [
          el("td", { text: g.collective }),
          el("td", { text: g.axis === null || g.axis === undefined ? "-" : g.axis }),
          el("td", { className: "num", text: g.ranks || "?" }),
          el("td", { className: "num count", text: g.calls }),
          el("td", { className: "num", text: g.forward }),
          el("td", { className: "num", text: g.backward }),
          el("td", { className: "num", text: g.after_backward }),
          el("td", { className: "num", text: formatBytes(g.bytes) }),
          estCell(g.bytes, factors[key]),
        ]);
      });
      if (!rows.length) {
        box.appendChild(el("p", { className: "empty", text: "No collectives were issued." }));
        return;
      }
      box.appendChild(el("h2", { text: "Collectives by op and mesh axis" }));
      box.appendChild(table(
        [["Collective"], ["Axis"], ["Ranks", "num"], ["Calls", "num"], ["Fwd", "num"], ["Bwd", "num"],
         ["After bwd", "num"], ["Bytes", "num"], ["Est. time", "num"]],
        rows, { className: "summary" }));
      return;
    }
    var sums = {};
    var keys = [];
    ["forward", "backward"].forEach(function (phase) {
      pairs(data["collectives_" + phase]).forEach(function (pair) {
        if (!sums[pair[0]]) { sums[pair[0]] = { forward: 0, backward: 0 }; keys.push(pair[0]); }
        sums[pair[0]][phase] += Number(pair[1]) || 0;
      });
    });
    if (!keys.length) return;
    box.appendChild(el("h2", { text: "Collectives" }));
    box.appendChild(table([["Op key"], ["Fwd", "num"], ["Bwd", "num"]], keys.map(function (k) {
      return el("tr", { "data-key": k }, [
        el("td", { className: "mono", text: k }),
        el("td", { className: "num", text: sums[k].forward }),
        el("td", { className: "num", text: sums[k].backward }),
      ]);
    }), { className: "summary" }));
  }

  function renderMeta(data, source) {
    var meta = data.commscope;
    var parts = [];
    if (meta) {
      if (meta.rank !== null && meta.rank !== undefined) {
        parts.push("rank " + meta.rank + (meta.world_size ? " of " + meta.world_size : ""));
      }
      if (meta.torch_version) parts.push("torch " + meta.torch_version);
      parts.push("noise level " + meta.noise_level);
      parts.push("schema v" + meta.schema_version);
      if (meta.bandwidth_gbps) {
        state.bandwidth = Number(meta.bandwidth_gbps);
        $("bandwidth").value = String(meta.bandwidth_gbps);
      }
    } else {
      parts.push("PyTorch CommDebugMode dump (counts only)");
    }
    if (source) parts.push(source);
    $("meta").textContent = parts.join(" \u00b7 ");
  }

  /* ------------------------------------------------------------------ loading */

  function isDump(data) {
    return data && typeof data === "object" && typeof data.fqn === "string" && Array.isArray(data.children);
  }

  function load(data, source) {
    if (!isDump(data)) {
      showError("Not a CommDebugMode JSON dump: expected an object with \"fqn\" and \"children\"" +
                (source ? " in " + source : "") + ".");
      return false;
    }
    showError("");
    state.data = data;
    renderMeta(data, source);
    renderSummary(data);
    var tree = $("tree");
    tree.textContent = "";
    tree.appendChild(renderNode(data, 0));
    $("drop-zone").classList.add("compact");
    applySearch();
    document.body.setAttribute("data-loaded", "true");
    return true;
  }

  function readFile(file) {
    if (!file) return;
    var reader = new FileReader();
    reader.onload = function () {
      var parsed;
      try {
        parsed = JSON.parse(String(reader.result));
      } catch (err) {
        showError("Could not parse " + file.name + " as JSON: " + err.message);
        return;
      }
      load(parsed, file.name);
    };
    reader.onerror = function () {
      showError("Could not read " + file.name + ".");
    };
    reader.readAsText(file);
  }

  /* ------------------------------------------------------------------ controls */

  function applySearch() {
    var query = $("search").value.trim().toLowerCase();
    var root = $("tree").firstElementChild;
    if (!root) return;
    function visit(li) {
      var fqn = (li.getAttribute("data-fqn") || "").toLowerCase();
      var hit = query !== "" && fqn.indexOf(query) !== -1;
      var childHit = false;
      var ul = li.querySelector(":scope > ul.children");
      if (ul) {
        Array.prototype.forEach.call(ul.children, function (child) {
          if (visit(child)) childHit = true;
        });
      }
      li.classList.toggle("hit", hit);
      if (query === "") {
        li.classList.remove("hidden");
        return false;
      }
      li.classList.toggle("hidden", !hit && !childHit);
      if (childHit) li.classList.add("open");
      return hit || childHit;
    }
    visit(root);
  }

  function refreshEstimates() {
    var value = parseFloat($("bandwidth").value);
    state.bandwidth = isFinite(value) && value > 0 ? value : 0;
    Array.prototype.forEach.call(document.querySelectorAll("td.est"), function (td) {
      var factor = td.getAttribute("data-factor");
      td.textContent = factor === null ? "-" : formatUs(estimateUs(td.getAttribute("data-bytes"), factor));
    });
  }

  function setAll(open) {
    Array.prototype.forEach.call(document.querySelectorAll("#tree .node"), function (li) {
      li.classList.toggle("open", open);
    });
  }

  function wire() {
    $("search").addEventListener("input", applySearch);
    $("bandwidth").addEventListener("input", refreshEstimates);
    $("expand-all").addEventListener("click", function () { setAll(true); });
    $("collapse-all").addEventListener("click", function () { setAll(false); });
    $("file-input").addEventListener("change", function (event) {
      readFile(event.target.files && event.target.files[0]);
    });
    var zone = $("drop-zone");
    document.addEventListener("dragover", function (event) {
      event.preventDefault();
      zone.classList.add("over");
    });
    document.addEventListener("dragleave", function (event) {
      if (event.target === document.documentElement || event.target === zone) zone.classList.remove("over");
    });
    document.addEventListener("drop", function (event) {
      event.preventDefault();
      zone.classList.remove("over");
      var files = event.dataTransfer && event.dataTransfer.files;
      if (files && files.length) readFile(files[0]);
    });
  }

  function boot() {
    wire();
    var embedded = $("comm-data");
    var text = embedded ? embedded.textContent.trim() : "";
    if (text && text !== "null") {
      var parsed;
      try {
        parsed = JSON.parse(text);
      } catch (err) {
        showError("The embedded dump is not valid JSON: " + err.message);
        return;
      }
      load(parsed, null);
    }
  }

  window.commscopeViewer = { load: load, state: state };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})();
