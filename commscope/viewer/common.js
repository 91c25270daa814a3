/*
 * commscope's offline pages (comm trace viewer, diff page): the few DOM and number
 * helpers they share, inlined before each page's own script. Plain DOM, no network.
 */
var commscope = (function () {
  "use strict";

  function $(id) {
    return document.getElementById(id);
  }

  /* el("td", {className: "num", text: "3"}, [children]): an element with attributes
     ("text" sets textContent) and children (nodes or strings; null ones skipped). */
  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (key) {
        var value = attrs[key];
        if (value === null || value === undefined) return;
        if (key === "text") node.textContent = String(value);
        else if (key === "className") node.className = value;
        else node.setAttribute(key, String(value));
      });
    }
    (children || []).forEach(function (child) {
      if (child === null || child === undefined) return;
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    });
    return node;
  }

  /* Decimal units, as the Python reports print them: 512 B, 4.1 KB, 12.6 MB. */
  function formatBytes(n) {
    var value = Number(n) || 0;
    var units = ["B", "KB", "MB", "GB", "TB"];
    for (var i = 0; i < units.length; i++) {
      if (value < 1000 || i === units.length - 1) {
        return i === 0 ? Math.round(value) + " B" : value.toFixed(1) + " " + units[i];
      }
      value /= 1000;
    }
    return n + " B";
  }

  /* Microseconds as ns / us / ms; "-" for a missing or infinite value. */
  function formatUs(us) {
    if (us === null || us === undefined || !isFinite(us)) return "-";
    if (us < 0.1) return (us * 1000).toFixed(1) + " ns";
    if (us < 10) return us.toFixed(2) + " us";
    if (us < 10000) return us.toFixed(1) + " us";
    return (us / 1000).toFixed(2) + " ms";
  }

  return { $: $, el: el, formatBytes: formatBytes, formatUs: formatUs };
})();
