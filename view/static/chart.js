// sleuth view: line charts drawn as inline SVG (no library). Exposes window.SleuthChart.
'use strict';
(function () {
  const NS = 'http://www.w3.org/2000/svg';
  function svg(tag, attrs) {
    const el = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
    return el;
  }

  // "nice" tick values covering [lo, hi]
  function ticks(lo, hi, n) {
    if (!(hi > lo)) return [lo];
    const raw = (hi - lo) / n;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
    return out;
  }

  function fmt(v) {
    if (v == null || !Number.isFinite(v)) return '–';
    if (Number.isInteger(v) && Math.abs(v) < 1e9) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2);
    return String(+v.toPrecision(4));
  }

  // nearest point (by x) in a sorted array of [x, y]
  function nearest(points, x) {
    let lo = 0, hi = points.length - 1;
    if (hi < 0) return null;
    while (hi - lo > 1) {
      const mid = (lo + hi) >> 1;
      if (points[mid][0] < x) lo = mid; else hi = mid;
    }
    return Math.abs(points[lo][0] - x) <= Math.abs(points[hi][0] - x) ? points[lo] : points[hi];
  }

  /**
   * lineChart({title, series: [{name, color, points: [[x, y], ...]}], xLabel})
   * returns a <div class="chart"> with the SVG, a legend and a hover tooltip.
   */
  function lineChart(opts) {
    const W = 560, H = 210, L = 52, R = 10, T = 8, B = 24;
    const series = opts.series
      .map((s) => ({ ...s, points: s.points.filter((p) => Number.isFinite(p[0]) && Number.isFinite(p[1])).sort((a, b) => a[0] - b[0]) }))
      .filter((s) => s.points.length);
    const box = document.createElement('div');
    box.className = 'chart';
    const title = document.createElement('div');
    title.className = 'ctitle';
    title.textContent = opts.title;
    box.append(title);
    if (!series.length) {
      const p = document.createElement('div');
      p.className = 'muted small';
      p.textContent = 'no finite values';
      box.append(p);
      return box;
    }
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (const s of series) for (const [x, y] of s.points) {
      x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
    }
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
    const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
    const root = svg('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img' });
    root.setAttribute('aria-label', opts.title);
    for (const v of ticks(y0, y1, 4)) {
      root.append(svg('line', { x1: L, x2: W - R, y1: sy(v), y2: sy(v), stroke: '#eceff4' }));
      const t = svg('text', { x: L - 4, y: sy(v) + 3, 'text-anchor': 'end' });
      t.textContent = fmt(v);
      root.append(t);
    }
    for (const v of ticks(x0, x1, 6)) {
      root.append(svg('line', { x1: sx(v), x2: sx(v), y1: H - B, y2: H - B + 4, stroke: '#aab' }));
      const t = svg('text', { x: sx(v), y: H - B + 14, 'text-anchor': 'middle' });
      t.textContent = fmt(v);
      root.append(t);
    }
    root.append(svg('line', { x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: '#aab' }));
    for (const s of series) {
      const d = s.points.map((p, i) => `${i ? 'L' : 'M'}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join('');
      root.append(svg('path', { d, fill: 'none', stroke: s.color, 'stroke-width': 1.6 }));
      if (s.points.length < 40) for (const p of s.points) root.append(svg('circle', { cx: sx(p[0]), cy: sy(p[1]), r: 2, fill: s.color }));
    }
    const cursor = svg('line', { y1: T, y2: H - B, stroke: '#889', 'stroke-dasharray': '3 3', visibility: 'hidden' });
    root.append(cursor);
    const dots = series.map((s) => { const c = svg('circle', { r: 3.5, fill: s.color, visibility: 'hidden' }); root.append(c); return c; });
    const hit = svg('rect', { x: L, y: T, width: W - L - R, height: H - T - B, fill: 'transparent' });
    root.append(hit);
    box.append(root);
    if (series.length > 1 || opts.alwaysLegend) {
      const leg = document.createElement('div');
      leg.className = 'legend';
      for (const s of series) {
        const i = document.createElement('i');
        i.style.background = s.color;
        leg.append(i, document.createTextNode(s.name));
      }
      box.append(leg);
    }
    const tip = document.createElement('div');
    tip.className = 'tip';
    tip.hidden = true;
    box.append(tip);
    hit.addEventListener('mousemove', (ev) => {
      const r = root.getBoundingClientRect();
      const px = ((ev.clientX - r.left) / r.width) * W;
      const x = x0 + ((px - L) / (W - L - R)) * (x1 - x0);
      const lines = [];
      let snapX = null;
      series.forEach((s, k) => {
        const p = nearest(s.points, x);
        if (!p) { dots[k].setAttribute('visibility', 'hidden'); return; }
        if (snapX === null) snapX = p[0];
        dots[k].setAttribute('cx', sx(p[0]));
        dots[k].setAttribute('cy', sy(p[1]));
        dots[k].setAttribute('visibility', 'visible');
        lines.push(`${series.length > 1 ? s.name + ': ' : ''}${fmt(p[1])}${p[0] !== snapX ? ` (${opts.xLabel || 'step'} ${fmt(p[0])})` : ''}`);
      });
      cursor.setAttribute('x1', sx(snapX)); cursor.setAttribute('x2', sx(snapX));
      cursor.setAttribute('visibility', 'visible');
      tip.textContent = `${opts.xLabel || 'step'} ${fmt(snapX)}\n${lines.join('\n')}`;
      tip.hidden = false;
      const bx = box.getBoundingClientRect();
      const left = ev.clientX - bx.left + 12;
      tip.style.left = `${Math.min(left, bx.width - tip.offsetWidth - 4)}px`;
      tip.style.top = `${ev.clientY - bx.top + 12}px`;
    });
    hit.addEventListener('mouseleave', () => {
      tip.hidden = true;
      cursor.setAttribute('visibility', 'hidden');
      dots.forEach((d) => d.setAttribute('visibility', 'hidden'));
    });
    return box;
  }

  window.SleuthChart = { lineChart, fmt };
})();
