// sleuth view: the episode page (the conversation as the model saw it, action tokens coloured by a quantity)
// and the group page (a group's members side by side).
'use strict';
(function () {
  const S = window.Sleuth;
  const { h, enc, fmt, show, isNum, getJSON, kvTable, recordsTable } = S;

  // ---- colour scales -------------------------------------------------------------------------------------
  const RED = [214, 39, 40], BLUE = [31, 99, 200], ORANGE = [230, 85, 13], PURPLE = [117, 68, 180];
  const rgba = (c, a) => `rgba(${c[0]},${c[1]},${c[2]},${a.toFixed(3)})`;
  const LABELS = { logprob: 'sampled logprob', adv: 'advantage', mismatch: 'rollout − trainer logprob', reward: 'step reward', entropy: 'entropy' };

  // {color(v) -> css colour | '', legend: [left label, gradient css, right label]}
  function makeScale(q, values) {
    let lo = Infinity, hi = -Infinity;
    for (const v of values) if (isNum(v)) { if (v < lo) lo = v; if (v > hi) hi = v; }
    if (lo === Infinity) return null;
    if (q === 'logprob') {                       // by the chance the sampler did not take it: 1 - exp(logprob)
      return { color: (v) => (isNum(v) ? rgba(ORANGE, 0.85 * Math.min(1, Math.max(0, 1 - Math.exp(v)))) : ''),
        legend: ['p 0', `linear-gradient(to right, ${rgba(ORANGE, 0.85)}, ${rgba(ORANGE, 0)})`, 'p 1'] };
    }
    if (lo < 0 && hi > 0 || q === 'adv') {      // diverging around 0: negative red, positive blue
      const m = Math.max(Math.abs(lo), Math.abs(hi)) || 1;
      return { color: (v) => (isNum(v) ? (v >= 0 ? rgba(BLUE, 0.8 * Math.min(1, v / m)) : rgba(RED, 0.8 * Math.min(1, -v / m))) : ''),
        legend: [fmt(-m), `linear-gradient(to right, ${rgba(RED, 0.8)}, rgba(255,255,255,0), ${rgba(BLUE, 0.8)})`, fmt(m)] };
    }
    const m = Math.max(Math.abs(lo), Math.abs(hi)) || 1;  // sequential by magnitude
    return { color: (v) => (isNum(v) ? rgba(PURPLE, 0.8 * Math.min(1, Math.abs(v) / m)) : ''),
      legend: ['0', `linear-gradient(to right, ${rgba(PURPLE, 0)}, ${rgba(PURPLE, 0.8)})`, fmt(lo < 0 && hi <= 0 ? -m : m)] };
  }
  function legend(q, scale) {
    if (!scale) return h('span', { class: 'muted small' }, q === 'none' ? '' : `no ${q} values in this episode`);
    return h('span', { class: 'scale' }, LABELS[q] || q, h('span', null, scale.legend[0]),
      h('span', { class: 'bar', style: { background: scale.legend[1] } }), h('span', null, scale.legend[2]));
  }

  // ---- tokens --------------------------------------------------------------------------------------------
  let tip = null;
  function tokenTip() {
    if (!tip) { tip = h('div', { class: 'tip', id: 'tokentip', hidden: true }); document.body.append(tip); }
    return tip;
  }
  function tokenText(t, quantities, chosen) {
    const lines = [`id ${t.id}  ${JSON.stringify(t.text == null ? '' : String(t.text))}`];
    for (const q of quantities) if (q in t) lines.push(`${q === chosen ? '▸ ' : '  '}${q} ${show(t[q])}`);
    return lines.join('\n');
  }
  function hoverable(box) {
    box.addEventListener('mousemove', (ev) => {
      const span = ev.target.closest && ev.target.closest('span.t');
      const el = tokenTip();
      if (!span || !span._tip) { el.hidden = true; return; }
      el.textContent = span._tip;
      el.hidden = false;
      const x = Math.min(ev.clientX + 14, window.innerWidth - el.offsetWidth - 6);
      const y = ev.clientY + 18 + el.offsetHeight > window.innerHeight ? ev.clientY - el.offsetHeight - 8 : ev.clientY + 18;
      el.style.left = `${x}px`;
      el.style.top = `${y}px`;
    });
    box.addEventListener('mouseleave', () => { tokenTip().hidden = true; });
    return box;
  }
  // action tokens as spans; colour(q) recolours them in place
  function actionTokens(toks, quantities) {
    const box = hoverable(h('div', { class: 'toks action' }));
    const spans = toks.map((t) => {
      const s = h('span', { class: 't' }, t.text == null ? '' : String(t.text));
      s._tok = t;
      return s;
    });
    box.append(...spans);
    if (!toks.length) box.append(h('span', { class: 'muted' }, '(no action tokens)'));
    box.colour = (q, scale) => {
      for (const s of spans) {
        const t = s._tok;
        s._tip = tokenText(t, quantities, q);
        s.title = s._tip;
        const v = t[q];
        s.style.background = scale && q !== 'none' ? scale.color(v) : '';
        s.classList.toggle('nv', q !== 'none' && !!scale && !isNum(v));
      }
    };
    return box;
  }
  const joined = (toks) => (toks || []).map((t) => (t.text == null ? '' : String(t.text))).join('');

  function callRow(turn) {
    if (turn.error) return h('div', { class: 'call' }, h('span', { class: 'badge bad' }, 'invalid call'), ' ', h('span', { class: 'neg' }, String(turn.error)),
      turn.tool_call ? h('pre', null, JSON.stringify(turn.tool_call, null, 2)) : null);
    if (turn.tool_call) return h('div', { class: 'call' }, h('span', { class: 'badge ok' }, 'valid call'), h('pre', null, JSON.stringify(turn.tool_call, null, 2)));
    return h('div', { class: 'call muted small' }, 'no tool call');
  }
  function isGold(read) {
    return Object.entries(read).some(([k, v]) => /gold/i.test(k) && (v === true || (isNum(v) && v > 0) || (Array.isArray(v) && v.length)));
  }
  function readRow(read) {
    if (!read || typeof read !== 'object') return null;
    const gold = isGold(read);
    return h('div', { class: `read${gold ? ' gold' : ''}` }, h('b', null, 'read '),
      gold ? h('span', { class: 'badge gold' }, 'gold') : h('span', { class: 'badge' }, 'not gold'),
      S.flatten(read, '', []).map(([k, v]) => h('span', { class: 'kvi' }, h('span', { class: 'muted' }, `${k} `), show(v))));
  }
  function turnBlock(turn, k, quantities, opts) {
    const action = actionTokens(turn.action || [], quantities);
    const obsText = (turn.observation && turn.observation.length) ? joined(turn.observation) : (turn.observation_text || '');
    const obs = obsText ? (opts.compact
      ? h('details', null, h('summary', null, `observation (${obsText.length} chars)`), h('pre', { class: 'toks obs' }, obsText))
      : h('div', null, h('div', { class: 'mh' }, h('b', null, 'observation'), h('span', null, `${(turn.observation || []).length} tokens`)), h('pre', { class: 'toks obs' }, obsText))) : null;
    const block = h('div', { class: `msg turn${opts.diverged ? ' diverged' : ''}`, id: `turn-${k}` },
      h('div', { class: 'mh' }, h('b', null, `turn ${k}`), h('span', null, `action ${(turn.action || []).length} tokens`),
        isNum(turn.reward) ? h('span', null, 'reward ', h('b', null, fmt(turn.reward))) : null,
        turn.finish_reason ? h('span', null, `finish ${turn.finish_reason}`) : null,
        turn.policy_version != null ? h('span', null, `policy v${turn.policy_version}`) : null,
        opts.diverged ? h('span', { class: 'badge gold' }, 'members diverge here') : null),
      action, callRow(turn), readRow(turn.read), obs);
    block.action = action;
    return block;
  }
  function verdictView(v) {
    if (!v) return [h('p', { class: 'muted' }, 'no verdict recorded')];
    const flat = { score: v.score }, lists = [];
    for (const [k, x] of Object.entries(v.details || {})) {
      if (Array.isArray(x) && x.length && x.every((e) => e && typeof e === 'object')) lists.push(h('h3', null, k), recordsTable(x));
      else flat[k] = x;
    }
    return [kvTable(flat), ...lists];
  }

  // ---- episode page ----------------------------------------------------------------------------------------
  S.views.episode = async (ctx, r, i) => {
    const ep = await getJSON(`/api/run/${enc(r)}/episode/${enc(i)}`);
    if (!ctx.alive()) return;
    const quantities = ep.quantities || [];
    const want = ctx.params.get('color');
    let q = want && (want === 'none' || quantities.includes(want)) ? want : ['adv', 'logprob', 'mismatch'].find((x) => quantities.includes(x)) || quantities[0] || 'none';
    const turns = ep.turns || [];
    const blocks = turns.map((t, k) => turnBlock(t, k, quantities, {}));
    const legendBox = h('span');
    const colour = () => {
      const all = [];
      for (const t of turns) for (const tok of t.action || []) all.push(tok[q]);
      const scale = q === 'none' ? null : makeScale(q, all);
      blocks.forEach((b) => b.action.colour(q, scale));
      S.fill(legendBox, legend(q, scale));
    };
    const epHash = (j) => S.hashOf(`/run/${enc(r)}/episode/${enc(j)}`, { color: q });
    const nb = ep.neighbours || {};
    const prev = h('a', { href: nb.prev != null ? epHash(nb.prev) : null, class: nb.prev == null ? 'muted' : null }, '← prev');
    const next = h('a', { href: nb.next != null ? epHash(nb.next) : null, class: nb.next == null ? 'muted' : null }, 'next →');
    const sel = h('select', { 'aria-label': 'colour tokens by', onchange: (ev) => {
      q = ev.target.value;
      S.setHash(epHash(i), false);
      if (nb.prev != null) prev.href = epHash(nb.prev);
      if (nb.next != null) next.href = epHash(nb.next);
      colour();
    } }, ['none', ...quantities].map((x) => h('option', { value: x, selected: x === q }, x === 'none' ? 'no colour' : LABELS[x] ? `${x} (${LABELS[x]})` : x)));
    const runName = await S.runName(r);
    if (!ctx.alive()) return;
    const prompt = ep.prompt || [];
    S.fill(ctx.box, 
      h('div', { class: 'ep-head' },
        h('h1', null, `Episode ${ep.i} · `, h('span', { class: 'mono' }, show(ep.task_id))),
        ep.failed ? h('span', { class: 'badge bad' }, 'failed') : h('span', { class: 'badge ok' }, 'ok'),
        h('span', null, 'score ', h('b', null, show(ep.score))), h('span', null, 'reward ', h('b', null, show(ep.reward))),
        h('span', { class: 'badge' }, `stop: ${show(ep.stop_reason)}`),
        ep.step != null ? h('span', null, `step ${ep.step}`) : null,
        ep.group != null ? h('a', { href: S.hashOf(`/run/${enc(r)}/group/${enc(ep.group)}`, { step: ep.step }) }, `group ${ep.group}`) : null,
        h('span', { class: 'nav' }, h('a', { href: `#/run/${enc(r)}/episodes` }, `${runName}: episodes`), prev, next)),
      ep.failed || ep.error ? S.errorBox(`this episode failed: ${ep.error || 'no error message recorded'}`) : null,
      h('div', { class: 'toolbar' }, h('label', null, 'colour action tokens by ', sel), legendBox,
        h('span', { class: 'muted small' }, 'hover a token for its id and values')),
      h('div', { class: 'cols' },
        h('section', { style: { flex: '3' } },
          h('div', { class: 'msg' }, h('div', { class: 'mh' }, h('b', null, 'prompt'), h('span', null, `${prompt.length} tokens (the messages as the model saw them)`)),
            h('pre', { class: 'toks prompt' }, joined(prompt) || '(no prompt tokens recorded)')),
          blocks.length ? blocks : h('p', { class: 'muted' }, 'no turns recorded')),
        h('section', { style: { flex: '1', maxWidth: '420px' } }, h('h2', null, 'Verdict'), ...verdictView(ep.verdict),
          h('h2', null, 'Turns'), turns.length ? h('table', null,
            h('thead', null, h('tr', null, ['turn', 'reward', 'call', 'read'].map((c) => h('th', null, c)))),
            h('tbody', null, turns.map((t, k) => h('tr', null, h('td', null, h('a', { href: `#turn-${k}`, onclick: (ev) => { ev.preventDefault(); blocks[k].scrollIntoView({ block: 'start' }); } }, String(k))),
              h('td', { class: 'num' }, show(t.reward)),
              h('td', null, t.error ? h('span', { class: 'badge bad' }, 'invalid') : t.tool_call ? h('span', { class: 'badge ok' }, 'valid') : '–'),
              h('td', null, t.read ? (isGold(t.read) ? h('span', { class: 'badge gold' }, 'gold') : 'read') : '–'))))) : null)));
    colour();
  };

  // ---- group page ------------------------------------------------------------------------------------------
  S.views.group = async (ctx, r, g) => {
    const step = ctx.params.get('step');
    const d = await getJSON(`/api/run/${enc(r)}/group/${enc(g)}${step != null && step !== '' ? `?step=${enc(step)}` : ''}`);
    if (!ctx.alive()) return;
    const members = d.members || [];
    const eps = await Promise.all(members.map((m) => getJSON(`/api/run/${enc(r)}/episode/${enc(m.i)}`).catch((e) => ({ _error: e.message }))));
    if (!ctx.alive()) return;
    const quantities = [...new Set(eps.flatMap((e) => e.quantities || []))];
    let q = ctx.params.get('color') || ['adv', 'logprob'].find((x) => quantities.includes(x)) || 'none';
    const best = Math.max(...members.map((m) => (isNum(m.reward) ? m.reward : -Infinity)));
    const blocks = [];
    const cols = members.map((m, k) => {
      const ep = eps[k];
      const head = h('div', null,
        h('h3', null, h('a', { href: S.hashOf(`/run/${enc(r)}/episode/${enc(m.i)}`, { color: q === 'none' ? null : q }) }, `#${m.i}`), m.sample != null ? ` · sample ${m.sample}` : '',
          ' ', m.failed ? h('span', { class: 'badge bad', title: m.error || '' }, 'failed') : null),
        h('table', { class: 'kv' }, h('tbody', null, [['reward', m.reward], ['advantage', m.advantage], ['score', m.score], ['turns', m.turns], ['tokens', m.tokens], ['stop', m.stop_reason]]
          .map(([k2, v]) => h('tr', null, h('th', null, k2), h('td', { class: isNum(v) ? 'num' : null }, show(v)))))));
      let body;
      if (ep._error) body = S.errorBox(ep._error);
      else body = (ep.turns || []).map((t, j) => { const b = turnBlock(t, j, ep.quantities || [], { compact: true, diverged: d.diverged_at === j }); blocks.push(b); return b; });
      return h('div', { class: `member${isNum(m.reward) && m.reward === best && members.length > 1 ? ' best' : ''}` }, head, body);
    });
    const legendBox = h('span');
    const colour = () => {
      const all = [];
      for (const b of blocks) for (const s of b.action.querySelectorAll('span.t')) all.push(s._tok[q]);
      const scale = q === 'none' ? null : makeScale(q, all);
      blocks.forEach((b) => b.action.colour(q, scale));
      S.fill(legendBox, legend(q, scale));
    };
    const sel = h('select', { 'aria-label': 'colour tokens by', onchange: (ev) => {
      q = ev.target.value;
      S.setHash(S.hashOf(`/run/${enc(r)}/group/${enc(g)}`, { step, color: q }), false);
      colour();
    } }, ['none', ...quantities].map((x) => h('option', { value: x, selected: x === q }, x === 'none' ? 'no colour' : x)));
    S.fill(ctx.box, 
      h('div', { class: 'ep-head' }, h('h1', null, 'Group ', h('span', { class: 'mono' }, show(d.group))),
        d.step != null ? h('span', null, `step ${d.step}`) : null, h('span', null, `${members.length} members`),
        h('span', null, d.diverged_at != null ? `actions first differ at turn ${d.diverged_at}` : 'the members\' actions never differ'),
        h('span', { class: 'nav' }, h('a', { href: `#/run/${enc(r)}/episodes` }, 'episodes'))),
      h('div', { class: 'toolbar' }, h('label', null, 'colour action tokens by ', sel), legendBox),
      members.length ? h('div', { class: 'group-cols' }, cols) : h('p', { class: 'muted' }, 'no members'));
    colour();
  };
})();
