// sleuth view: the run page (summary, curves, stage times, reports), the episode list and the compare page.
'use strict';
(function () {
  const S = window.Sleuth;
  const { h, enc, fmt, show, isNum, getJSON, recordsTable, kvTable } = S;
  const PAGE = 50;

  // ---- run page ----------------------------------------------------------------------------------------
  function ciText(ci) {
    if (ci == null) return '';
    if (Array.isArray(ci) && ci.length === 2) return `[${fmt(ci[0])}, ${fmt(ci[1])}]`;
    if (typeof ci === 'object') {
      const lo = ci.low ?? ci.lo ?? ci.ci_low, hi = ci.high ?? ci.hi ?? ci.ci_high;
      if (lo !== undefined || hi !== undefined) return `[${fmt(lo)}, ${fmt(hi)}]`;
    }
    if (isNum(ci)) return `± ${fmt(ci)}`;
    return show(ci);
  }
  const isObj = (v) => v && typeof v === 'object' && !Array.isArray(v);

  function nested(key, value, out) {   // sub-tables of a summary (breakdown.source, stop_reasons, ...)
    const vals = Object.values(value);
    if (vals.length && vals.every((v) => isObj(v) && Object.values(v).length && Object.values(v).every(isObj))) {
      for (const [k, v] of Object.entries(value)) nested(`${key}.${k}`, v, out);
    } else out.push(h('div', null, h('h3', null, key), recordsTable(value)));
    return out;
  }

  function summaryView(summary) {
    if (!summary) return [h('p', { class: 'muted' }, 'no summary.json in this run')];
    const rows = [], subs = [];
    for (const [k, v] of Object.entries(summary)) {
      if (k.endsWith('_ci') && k.slice(0, -3) in summary) continue;
      if (isObj(v)) { if (Object.keys(v).length) nested(k, v, subs); continue; }
      const ci = summary[`${k}_ci`];
      rows.push(h('tr', null, h('th', null, k),
        h('td', { class: isNum(v) ? 'num' : null }, show(v)),
        h('td', { class: 'num muted' }, ciText(ci))));
    }
    const hasCI = Object.keys(summary).some((k) => k.endsWith('_ci'));
    return [h('table', { class: 'kv summary' },
      hasCI ? h('thead', null, h('tr', null, h('th', null, ''), h('th', { class: 'num' }, 'value'), h('th', { class: 'num' }, '95% CI'))) : null,
      h('tbody', null, rows)), ...subs];
  }

  function fileURL(r, name) { return `/api/run/${enc(r)}/file/${enc(name)}`; }
  function reportsView(r, names) {
    if (!names || !names.length) return [h('p', { class: 'muted' }, 'no report files')];
    const data = window.SLEUTH_DATA;
    const out = [];
    const imgs = [];
    for (const name of names) {
      const url = fileURL(r, name);
      const isImg = /\.(png|jpe?g|svg|gif)$/i.test(name);
      if (data) {                                  // static export: a file is there as a data: URL or as text
        const v = data[url];
        if (typeof v !== 'string') { out.push(h('li', null, name, ' ', h('span', { class: 'muted' }, '(not in this export)'))); continue; }
        if (v.startsWith('data:')) {
          out.push(h('li', null, h('a', { href: v, download: name }, name)));
          if (isImg) imgs.push(h('figure', null, h('img', { class: 'report', src: v, alt: name })));
        } else out.push(h('li', null, h('details', null, h('summary', null, name), h('pre', { class: 'text obs' }, v))));
        continue;
      }
      if (isImg) {
        out.push(h('li', null, h('a', { href: url, target: '_blank', rel: 'noopener' }, name)));
        imgs.push(h('figure', null, h('img', { class: 'report', src: url, alt: name, loading: 'lazy' })));
      } else {
        const pre = h('pre', { class: 'text obs' }, 'loading…');
        const det = h('details', null, h('summary', null, name, ' ', h('a', { href: url, target: '_blank', rel: 'noopener' }, 'raw')), pre);
        det.addEventListener('toggle', async () => {
          if (!det.open || pre.dataset.loaded) return;
          pre.dataset.loaded = '1';
          try {
            const res = await fetch(url, { cache: 'no-store' });
            const text = await res.text();
            pre.textContent = res.ok ? text : `could not read ${name}: ${res.status} ${text.slice(0, 200)}`;
          } catch (e) { pre.textContent = `could not read ${name}: ${e.message}`; }
        });
        out.push(h('li', null, det));
      }
    }
    return [h('ul', { class: 'reports' }, out), ...imgs];
  }

  function defaultMetrics(names) {
    const pref = ['reward/mean', 'score', 'loss/policy', 'loss', 'adv/absmax', 'entropy/mean', 'mismatch/mean', 'grad_norm'];
    const got = pref.filter((m) => names.includes(m));
    return (got.length ? got : names.filter((n) => n !== 'step')).slice(0, 4);
  }
  function points(rows, metric) {
    return (rows || []).map((row, k) => [isNum(row.step) ? row.step : k + 1, row[metric]]).filter((p) => isNum(p[1]));
  }

  S.views.run = async (ctx, r) => {
    const runPath = `/api/run/${enc(r)}`;
    let run = await getJSON(runPath);
    if (!ctx.alive()) return;
    const runs = await S.runs().catch(() => []);
    const others = {};                     // other runs' details, for overlaid curves (fetched when needed)
    let chosen = ctx.params.has('m') ? ctx.params.get('m').split(',').filter(Boolean) : null;
    let overlay = ctx.params.get('overlay') !== '0';
    let filterText = '';

    const head = h('div', { class: 'ep-head' });
    const summaryBox = h('section'), metaBox = h('section');
    const pickBox = h('div'), chartsBox = h('div', { class: 'charts' });
    const stageBox = h('div'), reportBox = h('div');
    S.fill(ctx.box, head,
      h('div', { class: 'cols' }, h('section', null, h('h2', null, 'Summary'), summaryBox), h('section', null, h('h2', null, 'What ran'), metaBox)),
      h('h2', null, 'Training curves'), pickBox, chartsBox,
      h('h2', null, 'Stage times'), stageBox,
      h('h2', null, 'Reports'), reportBox);

    function saveHash() {
      S.setHash(S.hashOf(`/run/${enc(r)}`, { m: chosen ? chosen.join(',') : null, overlay: overlay ? null : '0' }), false);
    }
    async function drawCharts() {
      const names = run.metric_names || [];
      const sel = (chosen || defaultMetrics(names)).filter((m) => names.includes(m));
      if (overlay && runs.length > 1) {
        await Promise.all(runs.filter((x) => x.id !== String(r) && !(x.id in others)).map(async (x) => {
          try { others[x.id] = await getJSON(`/api/run/${enc(x.id)}`); } catch (e) { others[x.id] = null; }
        }));
      }
      if (!ctx.alive()) return;
      const charts = sel.map((m) => {
        const series = [{ name: run.name, color: S.runColor(r), points: points(run.metrics, m) }];
        if (overlay) for (const x of runs) {
          const o = others[x.id];
          if (x.id !== String(r) && o && (o.metric_names || []).includes(m)) series.push({ name: o.name, color: S.runColor(x.id), points: points(o.metrics, m) });
        }
        return window.SleuthChart.lineChart({ title: m, series, xLabel: 'step' });
      });
      S.fill(chartsBox, ...(charts.length ? charts : [h('p', { class: 'muted' }, names.length ? 'pick metrics above' : 'no metrics.jsonl in this run')]));
    }
    let pickedNames = null;
    function drawPicker() {
      const names = run.metric_names || [];
      if (pickedNames === names.join('\n')) return;
      pickedNames = names.join('\n');
      if (!names.length) { S.fill(pickBox, ); return; }
      const sel = new Set(chosen || defaultMetrics(names));
      const boxes = names.map((m) => h('label', { title: m }, h('input', {
        type: 'checkbox', value: m, checked: sel.has(m),
        onchange: () => { chosen = boxes.map((l) => l.firstChild).filter((c) => c.checked).map((c) => c.value); saveHash(); drawCharts(); },
      }), ' ', m));
      const list = h('div', { class: 'metric-pick' }, boxes);
      const applyFilter = () => { const q = filterText.toLowerCase(); boxes.forEach((l) => { l.hidden = !!q && !l.title.toLowerCase().includes(q); }); };
      applyFilter();
      S.fill(pickBox, h('div', { class: 'toolbar' },
        h('input', { type: 'search', placeholder: 'filter metrics', value: filterText, oninput: (ev) => { filterText = ev.target.value; applyFilter(); } }),
        h('button', { type: 'button', onclick: () => { chosen = []; boxes.forEach((l) => { l.firstChild.checked = false; }); saveHash(); drawCharts(); } }, 'none'),
        runs.length > 1 ? h('label', null, h('input', { type: 'checkbox', checked: overlay, onchange: (ev) => { overlay = ev.target.checked; saveHash(); drawCharts(); } }), ' overlay the other runs that have the metric') : null,
        h('span', { class: 'muted small' }, `${names.length} metrics, ${(run.metrics || []).length} rows`)), list);
    }
    function paint() {
      S.fill(head, h('h1', null, run.name), h('span', { class: 'badge kind' }, run.kind), h('span', { class: 'mono muted small' }, run.path),
        h('a', { href: `#/run/${enc(r)}/episodes` }, `${fmt(run.episodes || 0)} episodes →`));
      S.fill(summaryBox, ...summaryView(run.summary));
      S.fill(metaBox, kvTable(run.meta || {}));
      S.fill(stageBox, run.stage_times ? recordsTable(run.stage_times) : h('p', { class: 'muted' }, 'no stage times recorded'));
      S.fill(reportBox, ...reportsView(r, run.reports));
      drawPicker();
      return drawCharts();
    }
    await paint();
    S.setLive(!!run.live, async () => {
      const fresh = await getJSON(runPath);
      if (!ctx.alive()) return;
      run = fresh;
      // the picker, summary and charts change in place; report images are not reloaded
      S.fill(head, h('h1', null, run.name), h('span', { class: 'badge kind' }, run.kind), h('span', { class: 'mono muted small' }, run.path),
        h('a', { href: `#/run/${enc(r)}/episodes` }, `${fmt(run.episodes || 0)} episodes →`));
      S.fill(summaryBox, ...summaryView(run.summary));
      S.fill(stageBox, run.stage_times ? recordsTable(run.stage_times) : h('p', { class: 'muted' }, 'no stage times recorded'));
      drawPicker();
      await drawCharts();
      if (!run.live) S.setLive(false);
    });
  };

  // ---- episode list --------------------------------------------------------------------------------------
  const COLS = [
    { key: 'index', label: '#', num: true, sort: 'index', get: (r) => r.i },
    { key: 'task', label: 'task', sort: 'task', get: (r) => r.task_id },
    { key: 'step', label: 'step', num: true, get: (r) => r.step, opt: true },
    { key: 'group', label: 'group', get: (r) => r.group, opt: true },
    { key: 'sample', label: 'sample', num: true, get: (r) => r.sample, opt: true },
    { key: 'score', label: 'score', num: true, sort: 'score', get: (r) => r.score },
    { key: 'reward', label: 'reward', num: true, get: (r) => r.reward },
    { key: 'turns', label: 'turns', num: true, sort: 'turns', get: (r) => r.turns },
    { key: 'tokens', label: 'tokens', num: true, sort: 'tokens', get: (r) => r.tokens },
    { key: 'stop', label: 'stop reason', get: (r) => r.stop_reason },
    { key: 'failed', label: 'status', get: (r) => r.failed },
  ];

  S.views.episodes = async (ctx, r) => {
    const p = ctx.params;
    const SORTS = ['index', 'score', '-score', 'turns', '-turns', 'tokens', '-tokens', 'task'];
    const st = { q: p.get('q') || '', sort: SORTS.includes(p.get('sort')) ? p.get('sort') : 'index',
      status: ['ok', 'failed'].includes(p.get('status')) ? p.get('status') : 'all', stop: p.get('stop') || '',
      offset: Math.max(0, parseInt(p.get('offset') || '0', 10) || 0) };
    const runP = getJSON(`/api/run/${enc(r)}`).catch(() => null);
    const title = h('h1', null, 'Episodes');
    const count = h('span', { class: 'muted' });
    const stopSel = h('select', { 'aria-label': 'stop reason', onchange: (ev) => change({ stop: ev.target.value }) }, h('option', { value: '' }, 'any stop reason'));
    if (st.stop) stopSel.append(h('option', { value: st.stop, selected: true }, st.stop));
    let typing = null;
    const search = h('input', { type: 'search', placeholder: 'search task, stop reason, error, text', value: st.q, 'aria-label': 'search',
      oninput: (ev) => { clearTimeout(typing); typing = setTimeout(() => change({ q: ev.target.value.trim() }, false), 300); } });
    const statusSel = h('select', { 'aria-label': 'status', onchange: (ev) => change({ status: ev.target.value }) },
      [['all', 'all episodes'], ['ok', 'ok'], ['failed', 'failed']].map(([v, l]) => h('option', { value: v, selected: st.status === v }, l)));
    const prev = h('button', { type: 'button', onclick: () => change({ offset: Math.max(0, st.offset - PAGE) }, true, true) }, '← prev');
    const next = h('button', { type: 'button', onclick: () => change({ offset: st.offset + PAGE }, true, true) }, 'next →');
    const thead = h('thead'), tbody = h('tbody'), msg = h('div');
    S.fill(ctx.box, title, h('div', { class: 'toolbar' }, search, statusSel, stopSel, prev, next, count), msg,
      h('div', { class: 'scroll' }, h('table', { class: 'wide episodes' }, thead, tbody)));

    function change(delta, push = true, keepOffset = false) {
      Object.assign(st, delta);
      if (!keepOffset) st.offset = delta.offset ?? 0;
      S.setHash(S.hashOf(`/run/${enc(r)}/episodes`, { q: st.q, sort: st.sort === 'index' ? null : st.sort,
        status: st.status === 'all' ? null : st.status, stop: st.stop, offset: st.offset || null }), push);
      load();
    }
    function sortBy(key) {
      // index and task sort one way (the server knows no -task); numbers go high-first, then low-first
      if (['index', 'task'].includes(key)) { change({ sort: key }); return; }
      change({ sort: st.sort === `-${key}` ? key : `-${key}` });
    }
    let seq = 0;
    async function load() {
      const mine = ++seq;
      const path = `/api/run/${enc(r)}/episodes?offset=${st.offset}&limit=${PAGE}&q=${enc(st.q)}&sort=${enc(st.sort)}&status=${enc(st.status)}&stop=${enc(st.stop)}`;
      let d;
      try { d = await getJSON(path); } catch (e) {
        if (mine === seq && ctx.alive()) { S.fill(msg, S.errorBox(e.message)); S.fill(tbody, ); }
        return;
      }
      if (mine !== seq || !ctx.alive()) return;
      S.fill(msg, d.complete === false ? h('p', { class: 'muted small' }, 'still indexing: the counts grow as the run is read') : null,
        d.torn ? h('p', { class: 'muted small' }, `${d.torn} unreadable (half-written or torn) line(s) skipped`) : null);
      const rows = d.rows || [];
      const cols = COLS.filter((c) => !c.opt || rows.some((x) => c.get(x) != null));
      S.fill(thead, h('tr', null, cols.map((c) => {
        const sorted = c.sort && (st.sort === c.sort || st.sort === `-${c.sort}`);
        return h('th', { class: [c.num ? 'num' : '', c.sort ? 'sortable' : '', sorted ? 'sorted' : '', sorted && !st.sort.startsWith('-') ? 'asc' : ''].join(' ').trim(),
          title: c.sort ? 'sort' : null, onclick: c.sort ? () => sortBy(c.sort) : null }, c.label);
      })));
      S.fill(tbody, ...rows.map((x) => {
        const href = `#/run/${enc(r)}/episode/${enc(x.i)}`;
        return h('tr', { class: `click${x.failed ? ' failed' : ''}`, onclick: (ev) => { if (!ev.target.closest('a')) location.hash = href; } },
          cols.map((c) => {
            const v = c.get(x);
            if (c.key === 'task') return h('td', null, h('a', { href }, v == null ? '–' : String(v)));
            if (c.key === 'group' && v != null) return h('td', null, h('a', { href: S.hashOf(`/run/${enc(r)}/group/${enc(v)}`, { step: x.step }) }, String(v)));
            if (c.key === 'failed') return h('td', null, v ? h('span', { class: 'badge bad', title: x.error || '' }, 'failed') : h('span', { class: 'badge ok' }, 'ok'));
            return h('td', { class: c.num ? 'num' : null }, show(v));
          }));
      }));
      if (!rows.length) tbody.append(h('tr', null, h('td', { colspan: cols.length, class: 'muted' }, d.total ? 'no rows on this page' : 'no episode matches')));
      const total = d.total || 0;
      count.textContent = total ? `${fmt(st.offset + 1)}–${fmt(st.offset + rows.length)} of ${fmt(total)}` : '0 episodes';
      prev.disabled = st.offset <= 0;
      next.disabled = st.offset + PAGE >= total;
      const reasons = d.stop_reasons || {};
      const keep = stopSel.value;
      S.fill(stopSel, h('option', { value: '' }, 'any stop reason'),
        Object.entries(reasons).map(([k, n]) => h('option', { value: k, selected: k === keep }, `${k} (${n})`)));
      if (keep && !(keep in reasons)) stopSel.append(h('option', { value: keep, selected: true }, keep));
    }
    await load();
    const run = await runP;
    if (!ctx.alive() || !run) return;
    S.fill(title, 'Episodes · ', h('a', { href: `#/run/${enc(r)}` }, run.name));
    S.setLive(!!run.live, load);
  };

  // ---- compare -----------------------------------------------------------------------------------------
  S.views.compare = async (ctx, a, b) => {
    const filter = ['better', 'worse', 'both_failed'].includes(ctx.params.get('filter')) ? ctx.params.get('filter') : 'all';
    const d = await getJSON(`/api/compare?a=${enc(a)}&b=${enc(b)}&filter=${enc(filter)}`);
    if (!ctx.alive()) return;
    const runs = await S.runs().catch(() => []);
    const pick = (side, cur) => h('select', { 'aria-label': `run ${side}`, onchange: (ev) => {
      location.hash = side === 'a' ? `#/compare/${enc(ev.target.value)}/${enc(b)}` : `#/compare/${enc(a)}/${enc(ev.target.value)}`;
    } }, runs.map((x) => h('option', { value: x.id, selected: x.id === String(cur) }, `${x.id}: ${x.name}`)));
    const c = d.counts || {};
    const total = Object.values(c).reduce((s, v) => s + (isNum(v) ? v : 0), 0);
    const filters = [['all', 'all', total], ['better', 'B better', c.better], ['worse', 'B worse', c.worse], ['both_failed', 'both failed', c.both_failed]];
    const rows = d.rows || [];
    const LIMIT = 2000;
    const cell = (run, side) => {
      if (!side) return h('td', { class: 'muted' }, 'missing');
      const txt = side.failed ? 'failed' : fmt(side.score);
      return h('td', { class: 'num' }, h('a', { href: `#/run/${enc(run)}/episode/${enc(side.i)}`, class: side.failed ? 'neg' : null }, txt));
    };
    const body = (n) => rows.slice(0, n).map((x) => h('tr', null, h('td', null, x.task_id),
      cell(a, x.a), cell(b, x.b),
      h('td', { class: `num ${isNum(x.delta) ? (x.delta > 0 ? 'pos' : x.delta < 0 ? 'neg' : '') : ''}` }, isNum(x.delta) ? (x.delta > 0 ? '+' : '') + fmt(x.delta) : '–')));
    const tbody = h('tbody', null, body(LIMIT));
    S.fill(ctx.box, 
      h('h1', null, 'Compare ', h('span', { style: { color: S.runColor(a) } }, `A: ${d.a}`), ' vs ', h('span', { style: { color: S.runColor(b) } }, `B: ${d.b}`)),
      h('div', { class: 'toolbar' }, 'A', pick('a', a), 'B', pick('b', b)),
      h('div', { class: 'toolbar filters' }, filters.map(([f, label, n]) =>
        h('a', { href: S.hashOf(`/compare/${enc(a)}/${enc(b)}`, { filter: f === 'all' ? null : f }), class: f === filter ? 'cur' : null }, `${label} (${isNum(n) ? n : 0})`)),
      h('span', { class: 'muted small' }, `same ${c.same ?? 0} · only in A ${c.only_a ?? 0} · only in B ${c.only_b ?? 0}`)),
      h('table', { class: 'compare' },
        h('thead', null, h('tr', null, h('th', null, 'task'), h('th', { class: 'num' }, `A: ${d.a}`), h('th', { class: 'num' }, `B: ${d.b}`), h('th', { class: 'num' }, 'Δ (B − A)'))),
        tbody),
      rows.length > LIMIT ? h('button', { type: 'button', onclick: (ev) => { S.fill(tbody, ...body(rows.length)); ev.target.remove(); } }, `show all ${rows.length} rows`) : null,
      rows.length ? null : h('p', { class: 'muted' }, 'no task matches this filter'));
  };
})();
