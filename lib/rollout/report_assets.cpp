#include "rollout/report_assets.h"

namespace dzr::rollout {

const std::string_view kReportErrorHook = R"js(
window.dzrErrors = [];
addEventListener('error', function (e) {
  var t = e.target;
  if (t && t !== window && (t.src || t.currentSrc)) dzrErrors.push('cannot load ' + (t.currentSrc || t.src));
  else dzrErrors.push(String(e.message || e.type));
}, true);
addEventListener('unhandledrejection', function (e) { dzrErrors.push('unhandled rejection: ' + e.reason); });
)js";

const std::string_view kReportCss = R"css(
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1320px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; margin: 0.3em 0; } h2 { font-size: 1.15em; margin: 1.2em 0 0.4em; }
nav { margin-bottom: 0.6em; } a { color: #1f5fa8; }
table { border-collapse: collapse; }
table.kv th { text-align: left; padding: 2px 12px 2px 0; font-weight: 600; vertical-align: top; white-space: nowrap; }
table.kv td { padding: 2px 0; word-break: break-word; font-family: ui-monospace, monospace; font-size: 12px; }
table.summary { width: 100%; font-size: 13px; }
table.summary th, table.summary td { border-bottom: 1px solid #e3e3e3; padding: 3px 8px; text-align: right; }
table.summary th { background: #f4f4f4; cursor: pointer; user-select: none; white-space: nowrap; position: sticky; top: 0; }
table.summary th.asc::after { content: " \25B2"; } table.summary th.desc::after { content: " \25BC"; }
table.summary td:nth-child(2), table.summary th:nth-child(2), table.summary td.note { text-align: left; }
td.note { color: #8a5300; font-size: 12px; }
.status { padding: 0 6px; border-radius: 3px; font-size: 12px; }
.status.ok { background: #dff3df; } .status.failed { background: #f8d4d4; } .status.incomplete { background: #fbe7c2; }
.random-weights { background: #fbe7c2; border: 1px solid #d9a441; padding: 6px 10px; border-radius: 4px; }
.table-tools { margin: 0.5em 0; display: flex; gap: 1em; align-items: center; }
.pager button { margin: 0 4px; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 10px; }
svg.plot { width: 100%; height: auto; border: 1px solid #eee; }
svg.plot g.series:hover { stroke-width: 3; }
.videos { display: flex; gap: 12px; flex-wrap: wrap; }
.videos figure { margin: 0; } .videos video { max-width: 100%; width: 480px; background: #000; image-rendering: pixelated; }
figcaption { text-align: center; color: #555; }
.controls { display: flex; gap: 8px; align-items: center; } .controls .seek { width: 320px; }
img.strip { max-width: 100%; image-rendering: pixelated; border: 1px solid #ddd; }
.totals { color: #333; }
)css";

const std::string_view kReportJs = R"js(
(function () {
  'use strict';

  // ---- summary table: sort by a column, filter by text, one page of rows at a time ----
  function initTable(table) {
    var tbody = table.tBodies[0];
    var rows = Array.prototype.slice.call(tbody.rows);
    var size = parseInt(table.dataset.pageSize, 10) || 50;
    var tools = table.previousElementSibling;
    var filter = tools.querySelector('.filter'), pager = tools.querySelector('.pager');
    var shown = rows, page = 0;

    function render() {
      var pages = Math.max(1, Math.ceil(shown.length / size));
      page = Math.min(Math.max(page, 0), pages - 1);
      rows.forEach(function (r) { r.hidden = true; });
      shown.slice(page * size, (page + 1) * size).forEach(function (r) { r.hidden = false; });
      pager.textContent = '';
      if (pages > 1) {
        var prev = document.createElement('button'); prev.textContent = '\u2039 previous'; prev.disabled = page === 0;
        prev.onclick = function () { page--; render(); };
        var next = document.createElement('button'); next.textContent = 'next \u203A'; next.disabled = page === pages - 1;
        next.onclick = function () { page++; render(); };
        pager.appendChild(prev);
        pager.appendChild(document.createTextNode(' page ' + (page + 1) + ' of ' + pages + ' '));
        pager.appendChild(next);
      }
      pager.appendChild(document.createTextNode(' ' + shown.length + ' of ' + rows.length + ' episodes'));
    }

    function key(row, col) { return row.cells[col] ? row.cells[col].getAttribute('data-v') : ''; }
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
      th.addEventListener('click', function () {
        var asc = !th.classList.contains('asc');
        Array.prototype.forEach.call(th.parentNode.cells, function (c) { c.classList.remove('asc', 'desc'); });
        th.classList.add(asc ? 'asc' : 'desc');
        rows.sort(function (a, b) {
          var x = key(a, col), y = key(b, col);
          if (x === '' || y === '') return x === y ? 0 : (x === '' ? 1 : -1);  // missing values last
          var nx = Number(x), ny = Number(y);
          var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
          return asc ? c : -c;
        });
        rows.forEach(function (r) { tbody.appendChild(r); });
        applyFilter();
      });
    });

    function applyFilter() {
      var q = filter.value.trim().toLowerCase();
      shown = rows.filter(function (r) { return !q || r.textContent.toLowerCase().indexOf(q) >= 0; });
      render();
    }
    filter.addEventListener('input', function () { page = 0; applyFilter(); });
    render();
  }

  // ---- predicted and observed video: one set of controls drives both ----
  function initVideos(group) {
    var videos = Array.prototype.slice.call(group.querySelectorAll('video'));
    var lead = videos[0], controls = group.nextElementSibling;
    var play = controls.querySelector('.play'), seek = controls.querySelector('.seek');
    var rate = controls.querySelector('.rate'), time = controls.querySelector('.time');
    function each(f) { videos.forEach(f); }
    function start(v) { var p = v.play(); if (p && p.catch) p.catch(function () {}); }
    play.addEventListener('click', function () {
      if (lead.paused) { each(function (v) { v.currentTime = lead.currentTime; start(v); }); play.textContent = 'pause both'; }
      else { each(function (v) { v.pause(); }); play.textContent = 'play both'; }
    });
    seek.addEventListener('input', function () {
      if (!isFinite(lead.duration)) return;
      var t = seek.value / 1000 * lead.duration;
      each(function (v) { v.currentTime = t; });
    });
    rate.addEventListener('change', function () { each(function (v) { v.playbackRate = Number(rate.value); }); });
    lead.addEventListener('timeupdate', function () {
      if (isFinite(lead.duration) && lead.duration > 0) seek.value = Math.round(lead.currentTime / lead.duration * 1000);
      time.textContent = lead.currentTime.toFixed(1) + ' / ' + (isFinite(lead.duration) ? lead.duration.toFixed(1) : '?') + ' s';
      // Keep the others within a frame of the lead (5 fps).
      videos.slice(1).forEach(function (v) { if (Math.abs(v.currentTime - lead.currentTime) > 0.1) v.currentTime = lead.currentTime; });
    });
  }

  Array.prototype.forEach.call(document.querySelectorAll('table.summary'), initTable);
  Array.prototype.forEach.call(document.querySelectorAll('[data-sync]'), initVideos);

  // ---- self-check (tests/browser): what a reader would see, as data ----
  function waitForMedia(v, timeoutMs) {
    return new Promise(function (resolve) {
      if (v.readyState >= 2 || v.error) return resolve();
      var done = function () { resolve(); };
      v.addEventListener('loadeddata', done, { once: true });
      v.addEventListener('error', done, { once: true });
      setTimeout(done, timeoutMs);
    });
  }
  window.dzrSelfTest = function (timeoutMs) {
    timeoutMs = timeoutMs || 10000;
    var videos = Array.prototype.slice.call(document.querySelectorAll('video'));
    return Promise.all(videos.map(function (v) { return waitForMedia(v, timeoutMs); })).then(function () {
      var r = { page: document.body.getAttribute('data-page'), errors: window.dzrErrors.slice() };
      r.rows = Array.prototype.map.call(document.querySelectorAll('table.summary tbody tr'), function (tr) {
        return { name: tr.cells[1].textContent, status: tr.cells[2].textContent, href: tr.cells[1].querySelector('a').getAttribute('href') };
      });
      r.plots = Array.prototype.map.call(document.querySelectorAll('svg.plot'), function (svg) {
        var box = svg.getBoundingClientRect();
        return { title: svg.querySelector('title').textContent, width: box.width, height: box.height,
                 marks: svg.querySelectorAll('polyline, g.bar rect').length };
      });
      r.videos = videos.map(function (v) {
        return { src: v.getAttribute('src'), readyState: v.readyState, duration: v.duration,
                 width: v.videoWidth, height: v.videoHeight, error: v.error ? v.error.code : 0 };
      });
      r.images = Array.prototype.map.call(document.querySelectorAll('img'), function (img) {
        return { src: img.getAttribute('src'), complete: img.complete, width: img.naturalWidth };
      });
      return r;
    });
  };
})();
)js";

}  // namespace dzr::rollout
