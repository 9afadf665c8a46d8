// sleuth view: the page. Vanilla JS, no build step, no network beyond the local server's /api.
// Every string from the data goes into the DOM as text (textContent / text nodes / attributes), never as HTML.
'use strict';
(function () {
  const S = (window.Sleuth = {});
  const fmt = window.SleuthChart.fmt;
  S.fmt = fmt;
  const PALETTE = ['#2458c6', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b', '#e377c2', '#17becf', '#7f7f7f', '#bcbd22'];
  S.runColor = (id) => PALETTE[(parseInt(id, 10) || 0) % PALETTE.length];

  // ---- DOM helpers -------------------------------------------------------------------------------------
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    if (attrs) for (const [k, v] of Object.entries(attrs)) {
      if (v == null || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k === 'text') el.textContent = String(v);
      else if (k === 'style') Object.assign(el.style, v);
      else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid == null || kid === false) continue;
      el.append(kid instanceof Node ? kid : String(kid));
    }
    return el;
  }
  S.h = h;
  // replace an element's children, skipping null/false (replaceChildren would write them as text)
  S.fill = (el, ...kids) => el.replaceChildren(...kids.flat(Infinity).filter((k) => k != null && k !== false).map((k) => (k instanceof Node ? k : String(k))));
  const enc = encodeURIComponent;
  S.enc = enc;
  const isNum = (v) => typeof v === 'number' && Number.isFinite(v);
  S.isNum = isNum;
  function show(v) {                         // any JSON value as one line of text
    if (v == null) return '–';
    if (typeof v === 'number') return fmt(v);
    if (typeof v === 'string') return v;
    if (typeof v === 'boolean') return v ? 'yes' : 'no';
    return JSON.stringify(v);
  }
  S.show = show;
  function errorBox(msg) { return h('div', { class: 'error-box', role: 'alert' }, String(msg)); }
  S.errorBox = errorBox;

  // key/value table; nested objects are flattened to dotted keys (one level of arrays kept as JSON)
  function flatten(obj, prefix, out) {
    for (const [k, v] of Object.entries(obj || {})) {
      const key = prefix ? `${prefix}.${k}` : k;
      if (v && typeof v === 'object' && !Array.isArray(v) && Object.keys(v).length) flatten(v, key, out);
      else out.push([key, v]);
    }
    return out;
  }
  S.flatten = flatten;
  function kvTable(obj) {
    const rows = flatten(obj, '', []);
    if (!rows.length) return h('p', { class: 'muted' }, 'nothing recorded');
    return h('table', { class: 'kv' }, h('tbody', null, rows.map(([k, v]) =>
      h('tr', null, h('th', null, k), h('td', { class: isNum(v) ? 'num' : null }, show(v))))));
  }
  S.kvTable = kvTable;

  // a list of records (or a dict of records / of scalars) as a table
  function recordsTable(data) {
    if (data == null) return h('p', { class: 'muted' }, 'none');
    let rows;
    if (Array.isArray(data)) rows = data.map((r) => (r && typeof r === 'object' ? r : { value: r }));
    else if (Object.values(data).every((v) => v && typeof v === 'object' && !Array.isArray(v)))
      rows = Object.entries(data).map(([k, v]) => ({ name: k, ...v }));
    else return kvTable(data);
    const cols = [];
    for (const r of rows) for (const k of Object.keys(r)) if (!cols.includes(k)) cols.push(k);
    return h('table', null,
      h('thead', null, h('tr', null, cols.map((c) => h('th', null, c)))),
      h('tbody', null, rows.map((r) => h('tr', null, cols.map((c) => h('td', { class: isNum(r[c]) ? 'num' : null }, show(r[c])))))));
  }
  S.recordsTable = recordsTable;

  // ---- data layer ----------------------------------------------------------------------------------------
  function parseJSON(text) {
    try { return JSON.parse(text); } catch (e) {
      // Python's json writes NaN/Infinity, which JSON.parse refuses: read them as null
      return JSON.parse(text.replace(/(?<=[:,[]\s*)(?:NaN|-?Infinity)(?=\s*[,}\]])/g, 'null'));
    }
  }
  function cmp(a, b) { return a < b ? -1 : a > b ? 1 : 0; }
  function localEpisodes(all, p) {         // the server's /episodes, done in the page for a static export
    const q = (p.get('q') || '').toLowerCase();
    const status = p.get('status') || 'all';
    const stop = p.get('stop') || '';
    let rows = (all.rows || []).filter((r) =>
      (status === 'all' || (status === 'failed') === !!r.failed) &&
      (!stop || r.stop_reason === stop) &&
      (!q || [r.task_id, r.stop_reason, r.error, r.group].some((v) => v != null && String(v).toLowerCase().includes(q))));
    const sort = p.get('sort') || 'index';
    const desc = sort.startsWith('-');
    const key = desc ? sort.slice(1) : sort;
    if (key !== 'index') {
      const f = key === 'task' ? 'task_id' : key;
      rows = rows.slice().sort((a, b) => {
        const x = a[f], y = b[f];
        if (x == null && y == null) return a.i - b.i;
        if (x == null) return 1;
        if (y == null) return -1;
        return (desc ? -cmp(x, y) : cmp(x, y)) || a.i - b.i;
      });
    }
    const offset = Math.max(0, parseInt(p.get('offset') || '0', 10) || 0);
    const limit = parseInt(p.get('limit') || '50', 10) || 50;
    return { total: rows.length, offset, limit, rows: rows.slice(offset, offset + limit), stop_reasons: all.stop_reasons || {} };
  }
  // the server's category of a compare row (view/episode.py compare), for filtering a static export's "all" rows
  function compareCategory(r) {
    const a = r.a, b = r.b;
    if (!a || !b) return a ? 'only_a' : 'only_b';
    if (a.failed && b.failed) return 'both_failed';
    if (isNum(r.delta)) return r.delta > 0 ? 'better' : r.delta < 0 ? 'worse' : 'same';
    return b.score != null ? 'better' : a.score != null ? 'worse' : 'same';
  }
  function localCompare(all, filter) {
    return filter === 'all' ? all : { ...all, rows: (all.rows || []).filter((r) => compareCategory(r) === filter) };
  }
  // an error answer is {"error": "..."} alone (an episode's own "error" field is data, not an error answer)
  const isErrorBody = (v) => !!v && typeof v === 'object' && !Array.isArray(v) && typeof v.error === 'string' && Object.keys(v).length === 1;
  async function getJSON(path) {
    const data = window.SLEUTH_DATA;
    if (data) {
      // the export quotes names with Python's quote(safe=''), which also escapes !'()*
      const alt = path.replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
      const key = Object.prototype.hasOwnProperty.call(data, path) ? path : Object.prototype.hasOwnProperty.call(data, alt) ? alt : null;
      if (key !== null) {
        const v = data[key];
        if (isErrorBody(v)) throw new Error(v.error);
        return v;
      }
      let m = path.match(/^(\/api\/run\/[^/?]+\/episodes)\?(.*)$/);
      if (m && data[`${m[1]}?offset=0&limit=all`]) return localEpisodes(data[`${m[1]}?offset=0&limit=all`], new URLSearchParams(m[2]));
      m = path.match(/^\/api\/compare\?a=([^&]*)&b=([^&]*)&filter=(.*)$/);
      if (m && data[`/api/compare?a=${m[1]}&b=${m[2]}&filter=all`]) return localCompare(data[`/api/compare?a=${m[1]}&b=${m[2]}&filter=all`], m[3]);
      throw new Error(`not included in this static export: ${path}`);
    }
    let res;
    try { res = await fetch(path, { cache: 'no-store', headers: { Accept: 'application/json' } }); }
    catch (e) { throw new Error(`cannot reach the sleuth view server (${path}): ${e.message}`); }
    const text = await res.text();
    let body;
    try { body = parseJSON(text); } catch (e) {
      throw new Error(`${res.status} ${res.statusText} from ${path}: the answer is not JSON (${text.slice(0, 120)})`);
    }
    if (!res.ok) throw new Error(body && typeof body.error === 'string' ? body.error : `${res.status} ${res.statusText} from ${path}`);
    if (isErrorBody(body)) throw new Error(body.error);
    return body;
  }
  S.getJSON = getJSON;
  S.isStatic = () => !!window.SLEUTH_DATA;

  let runsPromise = null;
  S.runs = () => (runsPromise = runsPromise || getJSON('/api/runs').then((d) => d.runs || []).catch((e) => { runsPromise = null; throw e; }));
  // a run id the server does not know is answered here (no 404 in the console)
  S.checkRun = async (r) => {
    let runs;
    try { runs = await S.runs(); } catch (e) { return; }   // the view's own request shows the error
    if (!runs.some((x) => x.id === String(r))) throw new Error(`no run ${JSON.stringify(String(r))} (runs: ${runs.map((x) => x.id).join(', ') || 'none'})`);
  };
  S.runName = async (r) => { try { const x = (await S.runs()).find((z) => z.id === String(r)); return x ? x.name : `run ${r}`; } catch (e) { return `run ${r}`; } };

  // ---- routing -----------------------------------------------------------------------------------------
  const main = () => document.getElementById('main');
  let gen = 0;                 // render generation: answers that arrive for an old view are dropped
  let rendered = null;         // the hash last rendered (changes made with setHash do not re-render)
  let liveTimer = null;
  S.views = {};

  function parseHash() {
    const raw = location.hash.replace(/^#/, '') || '/';
    const at = raw.indexOf('?');
    const path = at < 0 ? raw : raw.slice(0, at);
    let parts;
    try { parts = path.split('/').filter(Boolean).map(decodeURIComponent); } catch (e) { parts = ['?bad']; }
    return { parts, params: new URLSearchParams(at < 0 ? '' : raw.slice(at + 1)) };
  }
  S.parseHash = parseHash;
  function hashOf(path, params) {
    const qs = [];
    for (const [k, v] of Object.entries(params || {})) if (v != null && v !== '') qs.push(`${k}=${enc(v).replace(/%2F/g, '/').replace(/%2C/g, ',')}`);
    return `#${path}${qs.length ? '?' + qs.join('&') : ''}`;
  }
  S.hashOf = hashOf;
  // change the URL to hold the view's state without re-rendering the view
  function setHash(hash, push) {
    rendered = hash;
    try { history[push ? 'pushState' : 'replaceState'](null, '', hash); }
    catch (e) { if (push) location.hash = hash; else location.replace(hash); }
  }
  S.setHash = setHash;

  function setLive(on, refresh) {
    if (liveTimer) { clearInterval(liveTimer); liveTimer = null; }
    document.getElementById('live').hidden = !on;
    if (on && refresh && !S.isStatic()) {
      const mine = gen;
      let busy = false;
      liveTimer = setInterval(async () => {
        if (mine !== gen) { clearInterval(liveTimer); return; }
        if (busy || document.hidden) return;
        busy = true;
        try { await refresh(); } catch (e) { /* the next poll tries again; the view keeps what it has */ }
        busy = false;
      }, 2000);
    }
  }
  S.setLive = setLive;

  async function nav(parts) {
    const el = document.getElementById('nav');
    const r = parts[0] === 'run' ? parts[1] : parts[0] === 'compare' ? parts[1] : null;
    const links = [];
    let runs = [];
    try { runs = await S.runs(); } catch (e) { /* the view shows the error */ }
    if (runs.length) {
      const sel = h('select', { title: 'run', 'aria-label': 'run',
        onchange: (ev) => { location.hash = `#/run/${enc(ev.target.value)}`; } },
      r == null ? h('option', { value: '' }, 'choose a run…') : null,
      runs.map((x) => h('option', { value: x.id, selected: x.id === r }, `${x.id}: ${x.name} (${x.kind})`)));
      links.push(sel);
    }
    if (r != null && parts[0] === 'run') {
      links.push(h('a', { href: `#/run/${enc(r)}`, class: parts.length === 2 ? 'cur' : null }, 'run'));
      links.push(h('a', { href: `#/run/${enc(r)}/episodes`, class: parts[2] === 'episodes' ? 'cur' : null }, 'episodes'));
    }
    if (runs.length > 1) {
      const a = r != null ? r : runs[0].id;
      const b = parts[0] === 'compare' ? parts[2] : (runs.find((x) => x.id !== a) || runs[1]).id;
      links.push(h('a', { href: `#/compare/${enc(a)}/${enc(b)}`, class: parts[0] === 'compare' ? 'cur' : null }, 'compare'));
    }
    S.fill(el, ...links);
  }

  async function route() {
    if (location.hash === rendered && rendered !== null) return;
    rendered = location.hash;
    const mine = ++gen;
    setLive(false);
    const { parts, params } = parseHash();
    const box = main();
    S.fill(box, h('p', { class: 'muted' }, 'loading…'));
    nav(parts);
    const ctx = { alive: () => mine === gen, params, parts, box };
    let view = null, args = [];
    if (!parts.length) view = S.views.home;
    else if (parts[0] === 'run' && parts.length === 2) { view = S.views.run; args = [parts[1]]; }
    else if (parts[0] === 'run' && parts[2] === 'episodes' && parts.length === 3) { view = S.views.episodes; args = [parts[1]]; }
    else if (parts[0] === 'run' && parts[2] === 'episode' && parts.length === 4) { view = S.views.episode; args = [parts[1], parts[3]]; }
    else if (parts[0] === 'run' && parts[2] === 'group' && parts.length === 4) { view = S.views.group; args = [parts[1], parts[3]]; }
    else if (parts[0] === 'compare' && parts.length === 3) { view = S.views.compare; args = [parts[1], parts[2]]; }
    try {
      if (!view) throw new Error(`no such page: ${location.hash} (try #/ for the runs)`);
      if (parts[0] === 'run') await S.checkRun(parts[1]);
      else if (parts[0] === 'compare') { await S.checkRun(parts[1]); await S.checkRun(parts[2]); }
      if (!ctx.alive()) return;
      await view(ctx, ...args);
    } catch (e) {
      if (ctx.alive()) S.fill(box, errorBox(e && e.message ? e.message : String(e)), h('p', null, h('a', { href: '#/' }, 'back to the runs')));
    }
    if (ctx.alive()) document.title = `sleuth view · ${location.hash.replace(/^#\/?/, '') || 'runs'}`;
  }
  S.route = route;

  function start() {
    window.addEventListener('hashchange', route);
    window.addEventListener('popstate', route);
    window.addEventListener('unhandledrejection', (ev) => {
      const b = document.getElementById('banner');
      b.textContent = `error: ${ev.reason && ev.reason.message ? ev.reason.message : ev.reason}`;
      b.hidden = false;
      ev.preventDefault();
    });
    route();
  }
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else setTimeout(start, 0);

  // ---- home: the runs ----------------------------------------------------------------------------------
  S.views.home = async (ctx) => {
    const runs = await S.runs();
    if (!ctx.alive()) return;
    if (runs.length === 1) { location.replace(`#/run/${enc(runs[0].id)}`); return; }
    S.fill(ctx.box, h('h1', null, 'Runs'),
      runs.length ? h('table', null,
        h('thead', null, h('tr', null, ['id', 'name', 'kind', 'path', ''].map((c) => h('th', null, c)))),
        h('tbody', null, runs.map((x) => h('tr', null,
          h('td', null, x.id), h('td', null, h('a', { href: `#/run/${enc(x.id)}` }, x.name)),
          h('td', null, h('span', { class: 'badge kind' }, x.kind)), h('td', { class: 'mono' }, x.path),
          h('td', null, h('a', { href: `#/run/${enc(x.id)}/episodes` }, 'episodes'))))))
        : h('p', { class: 'muted' }, 'no runs'));
  };
})();
