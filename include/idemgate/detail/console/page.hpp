// SPDX-License-Identifier: MIT
// The console's one page: HTML, its style and its script, all inline (nothing is fetched from
// anywhere else). Includes nothing of idemgate.
#pragma once

#include <string>
#include <string_view>

namespace idemgate::detail::console {

/// The page's style sheet, the text of its one `<style>` element (its hash is in the page's
/// Content-Security-Policy).
inline constexpr std::string_view page_style = R"css(
:root { --ok: #1b7f3b; --alarm: #b3261e; --muted: #5f6368; --line: #dadce0; }
* { box-sizing: border-box; }
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #202124; background: #f8f9fa; }
header { display: flex; align-items: center; gap: 1em; padding: .6em 1.2em; background: #202124;
  color: #fff; }
header h1 { font-size: 16px; margin: 0; flex: 1; }
header button { background: #3c4043; color: #fff; border: 0; }
main { padding: 1em 1.2em; display: grid; gap: 1em; max-width: 1200px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: .8em 1em; }
h2 { font-size: 15px; margin: 0 0 .6em; }
.cards { display: grid; grid-template-columns: repeat(3, 1fr); gap: .8em; }
.card { border: 1px solid var(--line); border-left: 6px solid var(--ok); border-radius: 4px;
  padding: .5em .8em; }
.card.alarm { border-left-color: var(--alarm); }
.card .value { font-size: 22px; font-weight: 600; }
.card .state { font-size: 12px; color: var(--ok); font-weight: 600; }
.card.alarm .state { color: var(--alarm); }
.card .hint, .muted { color: var(--muted); font-size: 12px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .3em .5em; border-bottom: 1px solid var(--line);
  vertical-align: top; }
th { font-size: 12px; color: var(--muted); font-weight: 600; }
td.reason { max-width: 480px; word-break: break-word; }
code, pre, .key { font-family: ui-monospace, monospace; font-size: 12px; }
pre { background: #f1f3f4; padding: .5em; white-space: pre-wrap; word-break: break-all; margin: 0; }
button { font: inherit; padding: .3em .8em; border: 1px solid var(--line); border-radius: 4px;
  background: #fff; cursor: pointer; }
button.primary { background: #1a73e8; color: #fff; border-color: #1a73e8; }
button:disabled { opacity: .5; cursor: default; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .2em 1em; margin: 0 0 .8em; }
dt { color: var(--muted); }
dd { margin: 0; word-break: break-all; }
textarea, input[type=text] { font: 12px ui-monospace, monospace; width: 100%; padding: .4em; }
textarea { min-height: 4em; }
.problem { border: 1px solid var(--alarm); background: #fce8e6; color: #5c0f0a; padding: .5em .8em;
  border-radius: 4px; margin: .6em 0; }
.problem strong { display: block; }
.done { border: 1px solid var(--ok); background: #e6f4ea; padding: .5em .8em; border-radius: 4px;
  margin: .6em 0; }
.row-actions { display: flex; gap: .6em; align-items: flex-start; flex-direction: column; }
.status { font-weight: 600; }
.inline { display: flex; gap: .5em; }
.inline input { flex: 1; }
[hidden] { display: none !important; }
)css";

/// The page's script, the text of its one `<script>` element (its hash is in the page's
/// Content-Security-Policy). It reads the JSON API relative to the page, writes every value with
/// `textContent` (never as HTML), and sends the console's header on every POST.
inline constexpr std::string_view page_script = R"js(
'use strict';
const $ = (id) => document.getElementById(id);
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (name === 'dataset') Object.assign(node.dataset, value);
    else if (name === 'onclick') node.addEventListener('click', value);
    else node[name] = value;
  }
  for (const child of children)
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}
async function call(path, options) {
  const response = await fetch('api/' + path, Object.assign({credentials: 'same-origin'}, options));
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) {
    const error = new Error(body && body.title ? body.title : response.statusText);
    error.problem = body || {title: response.statusText, status: response.status};
    throw error;
  }
  return body;
}
const get = (path) => call(path, {headers: {'Accept': 'application/json'}});
const post = (path, body) => call(path, {method: 'POST', body: JSON.stringify(body || {}),
  headers: {'Accept': 'application/json', 'Content-Type': 'application/json',
            'X-Idemgate-Console': '1'}});
function showProblem(box, error) {
  const p = error.problem || {title: String(error), detail: ''};
  box.replaceChildren(el('strong', {}, p.title || 'Error'), el('span', {}, p.detail || ''));
  box.hidden = false;
}
const when = (text) => text ? text.replace('T', ' ').replace(/\.\d+Z$/, ' UTC') : '';
const seconds = (s) => s === null || s === undefined ? 'none' :
  s < 120 ? s + ' s' : s < 7200 ? Math.round(s / 60) + ' min' : Math.round(s / 3600) + ' h';

function card(id, title, value, alarm, hint) {
  const box = $(id);
  box.className = 'card' + (alarm ? ' alarm' : '');
  box.replaceChildren(el('div', {className: 'muted'}, title), el('div', {className: 'value'}, value),
    el('div', {className: 'state'}, alarm ? 'ALARM' : 'OK'), el('div', {className: 'hint'}, hint));
}
async function loadSignals() {
  const s = await get('signals');
  $('gate').textContent = s.gate;
  const h = s.health;
  card('signal-duplicates', 'Duplicate ratio', (100 * s.duplicate_ratio).toFixed(1) + ' %',
    h.key_derivation_suspect || h.upstream_misbehaving,
    h.key_derivation_suspect ? 'no duplicates at all: is the key derivation broken?' :
    h.upstream_misbehaving ? 'an upstream redelivers far too much' :
    s.duplicates + ' of ' + s.events + ' events in the last ' + seconds(s.window_seconds));
  card('signal-in-flight', 'Oldest in flight', seconds(s.oldest_in_flight_seconds), h.stranded_work,
    s.in_flight + ' in flight, ' + s.retrying + ' retrying' +
    (h.stranded_work ? ': is a reconciler running?' : ''));
  card('signal-mismatches', 'Keys with two results', String(s.mismatched_keys), h.result_mismatch,
    s.mismatches_total + ' mismatches recorded in all');
  // PostgreSQL only: the oldest transaction open in the log's database.
  const held = s.oldest_snapshot_seconds;
  $('signal-snapshot').hidden = held === null || held === undefined;
  if (!$('signal-snapshot').hidden)
    card('signal-snapshot', 'Oldest open transaction', held ? seconds(held) : 'none',
      h.old_snapshot, !s.oldest_snapshot_holder ? 'none open in the log\'s database' :
      s.oldest_snapshot_holder + (h.old_snapshot ?
        ': until it ends, no vacuum reclaims what the log deleted' : ''));
  $('counts').textContent = s.escalated + ' escalated (the manual queue)';
}
function rowLink(row) {
  return el('button', {className: 'open', dataset: {key: row.key},
    onclick: () => openRow(row.key)}, 'Open');
}
async function loadQueue() {
  const body = await get('escalated');
  const rows = body.rows.map((row) => el('tr', {dataset: {key: row.key}},
    el('td', {className: 'key'}, row.key.slice(0, 16) + '…'),
    el('td', {}, row.label || ''),
    el('td', {className: 'reason'}, row.reason),
    el('td', {}, String(row.attempts)),
    el('td', {}, when(row.updated_at)),
    el('td', {}, rowLink(row))));
  $('queue-rows').replaceChildren(...rows);
  $('queue-empty').hidden = rows.length > 0;
}
async function loadCauses() {
  let body;
  try { body = await get('causes'); } catch (e) { $('causes').hidden = true; return; }
  $('causes').hidden = false;
  const rows = body.causes.map((c) => el('tr', {},
    el('td', {className: 'status'}, c.status),
    el('td', {className: 'reason'}, c.reason),
    el('td', {}, String(c.rows)),
    el('td', {}, when(c.first_seen)),
    el('td', {}, when(c.last_seen)),
    el('td', {}, el('button', {className: 'show-cause', onclick: () => showCause(c)}, 'Show rows'),
      ' ', c.status === 'failed' ?
      el('button', {className: 'redrive-cause', onclick: () => redriveCause(c.reason)},
         'Re-drive these') : '')));
  $('cause-rows').replaceChildren(...rows);
  $('causes-empty').hidden = rows.length > 0;
}
async function showCause(c) {
  try {
    const body = await get('rows?status=' + encodeURIComponent(c.status) + '&reason=' +
                           encodeURIComponent(c.reason));
    $('cause-list-title').textContent = body.count + ' ' + c.status + ' row(s): ' + c.reason;
    $('cause-list-rows').replaceChildren(...body.rows.map((row) => el('tr', {dataset: {key: row.key}},
      el('td', {className: 'key'}, row.key.slice(0, 16) + '…'),
      el('td', {}, row.label || ''),
      el('td', {}, row.status),
      el('td', {}, String(row.attempts)),
      el('td', {}, when(row.updated_at)),
      el('td', {}, rowLink(row)))));
    $('cause-list').hidden = false;
  } catch (e) { showProblem($('page-problem'), e); }
}
async function redriveCause(reason) {
  $('page-problem').hidden = true;
  $('page-done').hidden = true;
  try {
    const r = await post('causes/redrive', {reason: reason});
    $('page-done').textContent = r.redriven + ' failed row(s) re-driven' +
      (r.still_failed > 0 ? ', ' + r.still_failed + ' left: re-drive again' : '');
    $('page-done').hidden = false;
    $('cause-list').hidden = true;
  } catch (e) { showProblem($('page-problem'), e); }
  refresh();
}
let current = null;
function field(name, value) { return [el('dt', {}, name), el('dd', {}, value)]; }
function renderRow(row) {
  current = row.key;
  $('row').hidden = false;
  $('row-key').textContent = row.key;
  $('row-status').textContent = row.status;
  $('row-fields').replaceChildren(
    ...field('label', row.label || '(none kept)'), ...field('reason', row.reason || ''),
    ...field('attempts', String(row.attempts)), ...field('duplicates', String(row.duplicates)),
    ...field('fence', String(row.fence)), ...field('created', when(row.created_at)),
    ...field('last change', when(row.updated_at)),
    ...field('outcome', row.result === null ? '(none)' : row.result));
  $('row-request').textContent = row.request === null ?
    '(not UTF-8; base64) ' + row.request_base64 : row.request;
  const history = row.history || [];
  $('row-history').replaceChildren(...history.map((h) => el('li', {},
    el('span', {className: 'status'}, h.outcome), ' (attempt ' + h.attempt + ', ' + when(h.at) + ')',
    h.reason ? ': ' + h.reason : '')));
  $('row-history-empty').hidden = history.length > 0;
  $('resolve-form').hidden = row.status !== 'escalated';
  $('redrive').hidden = row.status !== 'failed';
}
async function openRow(key) {
  $('row-problem').hidden = true;
  $('row-done').hidden = true;
  try { renderRow(await get('rows/' + encodeURIComponent(key))); }
  catch (e) { $('row').hidden = false; showProblem($('row-problem'), e); }
  $('row').scrollIntoView();
}
async function resolveRow() {
  $('row-problem').hidden = true;
  $('row-done').hidden = true;
  $('resolve').disabled = true;
  try {
    const r = await post('rows/' + current + '/resolve', {outcome: $('outcome').value});
    renderRow(r.row);
    $('row-done').textContent = 'Resolved: the outcome and the business write were committed.';
    $('row-done').hidden = false;
    $('outcome').value = '';
  } catch (e) { showProblem($('row-problem'), e); }
  $('resolve').disabled = false;
  refresh();
}
async function redriveRow() {
  $('row-problem').hidden = true;
  $('row-done').hidden = true;
  try {
    const r = await post('rows/' + current + '/redrive', {});
    renderRow(r.row);
    $('row-done').textContent = 'Re-driven: the next delivery or the reconciler claims it again.';
    $('row-done').hidden = false;
  } catch (e) { showProblem($('row-problem'), e); }
  refresh();
}
// body[data-loaded] is "yes" once no reload is running (the browser test waits for it).
let reloads = 0;
async function refresh(clear) {
  reloads++;
  document.body.dataset.loaded = 'no';
  if (clear === true) { $('page-problem').hidden = true; $('page-done').hidden = true; }
  try {
    await Promise.all([loadSignals(), loadQueue(), loadCauses()]);
    $('updated').textContent = 'updated ' + new Date().toLocaleTimeString();
  } catch (e) { showProblem($('page-problem'), e); }
  if (--reloads === 0) document.body.dataset.loaded = 'yes';
}
$('refresh').addEventListener('click', () => refresh(true));
$('resolve').addEventListener('click', resolveRow);
$('redrive').addEventListener('click', redriveRow);
$('open-key-form').addEventListener('submit', (event) => {
  event.preventDefault();
  openRow($('open-key').value.trim());
});
$('logout').addEventListener('click', async () => {
  await fetch('logout', {method: 'POST', credentials: 'same-origin',
    headers: {'X-Idemgate-Console': '1'}});
  document.body.replaceChildren(el('p', {}, 'Signed out. Open the console again with its token.'));
});
refresh(true);
)js";

/// The page around the style and the script.
[[nodiscard]] inline std::string page_html() {
  std::string page;
  page += R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>idemgate console</title>
<style>)html";
  page += page_style;
  page += R"html(</style>
</head>
<body>
<header>
<h1>idemgate console — gate <span id="gate"></span></h1>
<span id="updated" class="muted"></span>
<button id="refresh" type="button">Refresh</button>
<button id="logout" type="button">Sign out</button>
</header>
<main>
<div id="page-problem" class="problem" role="alert" hidden></div>
<div id="page-done" class="done" role="status" hidden></div>
<section id="signals">
<h2>Signals</h2>
<div class="cards">
<div id="signal-duplicates" class="card"></div>
<div id="signal-in-flight" class="card"></div>
<div id="signal-mismatches" class="card"></div>
<div id="signal-snapshot" class="card" hidden></div>
</div>
<p id="counts" class="muted"></p>
</section>
<section id="causes" hidden>
<h2>Causes: failed and escalated rows by reason</h2>
<table>
<thead><tr><th>status</th><th>reason</th><th>rows</th><th>first</th><th>last</th><th></th></tr></thead>
<tbody id="cause-rows"></tbody>
</table>
<p id="causes-empty" class="muted" hidden>Nothing failed or escalated.</p>
<div id="cause-list" hidden>
<h2 id="cause-list-title"></h2>
<table>
<thead><tr><th>key</th><th>label</th><th>status</th><th>attempts</th><th>last change</th><th></th></tr></thead>
<tbody id="cause-list-rows"></tbody>
</table>
</div>
</section>
<section id="queue">
<h2>Manual queue: escalated events, oldest first</h2>
<table>
<thead><tr><th>key</th><th>label</th><th>reason</th><th>attempts</th><th>since</th><th></th></tr></thead>
<tbody id="queue-rows"></tbody>
</table>
<p id="queue-empty" class="muted" hidden>The manual queue is empty.</p>
<form id="open-key-form" class="inline">
<input id="open-key" type="text" placeholder="any key of this gate (64 hex digits)" autocomplete="off">
<button type="submit">Open row</button>
</form>
</section>
<section id="row" hidden>
<h2>Row <span id="row-key" class="key"></span>: <span id="row-status" class="status"></span></h2>
<div id="row-problem" class="problem" role="alert" hidden></div>
<div id="row-done" class="done" role="status" hidden></div>
<dl id="row-fields"></dl>
<h2>Request</h2>
<pre id="row-request"></pre>
<h2>History</h2>
<ol id="row-history"></ol>
<p id="row-history-empty" class="muted" hidden>No history kept for this row.</p>
<div class="row-actions">
<div id="resolve-form">
<h2>Resolve</h2>
<p class="muted">Enter the outcome as the gate stores it (its codec's text, e.g. JSON).
Resolving commits it with the service's business write, in one transaction; if the business write
fails, nothing is committed and the row stays escalated.</p>
<textarea id="outcome" spellcheck="false"></textarea>
<button id="resolve" class="primary" type="button">Resolve with this outcome</button>
</div>
<button id="redrive" type="button" hidden>Re-drive this failed row</button>
</div>
</section>
</main>
<script>)html";
  page += page_script;
  page += R"html(</script>
</body>
</html>
)html";
  return page;
}

}  // namespace idemgate::detail::console
