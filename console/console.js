/* loopguard console: runs, a run's timeline, the kill switch, budgets and
 * incidents, over the server's own API (same origin). No framework, no
 * inline code (CSP script-src 'self'); every text from the API is set with
 * textContent, never as HTML. The operator token lives in sessionStorage
 * and goes out as Authorization: Bearer, never as a cookie. */
'use strict';
(function () {
  const TOKEN_KEY = 'loopguard.token';
  const PAGE = 25, POLL_MS = 3000, INCIDENTS = 1000;
  let token = sessionStorage.getItem(TOKEN_KEY) || '';
  let runs = [], page = 0, timer = null, current = null, pending = null, shown = 0;
  const $ = (s) => document.querySelector(s);

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : v);
    }
    for (const k of kids) if (k !== null && k !== undefined) e.append(k);
    return e;
  }
  const svg = (tag, attrs) => {
    const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    return e;
  };

  function status(msg, isError) {
    const s = $('#status');
    s.textContent = msg || '';
    s.classList.toggle('error', !!isError);
  }

  class ApiError extends Error { constructor(code, msg) { super(msg); this.code = code; } }

  async function api(path, opts) {
    opts = opts || {};
    const headers = {};
    if (token) headers.Authorization = 'Bearer ' + token;
    if (opts.body !== undefined) headers['Content-Type'] = 'application/json';
    let r;
    try {
      r = await fetch(path, { method: opts.method || 'GET', headers, cache: 'no-store',
        credentials: 'omit', body: opts.body !== undefined ? JSON.stringify(opts.body) : undefined });
    } catch (e) { throw new ApiError(0, 'the server cannot be reached'); }
    if (r.status === 401 || r.status === 403) {
      showToken(r.status === 401 ? (token ? 'This token was not accepted.' : 'This server needs an operator token.')
        : 'This token lacks the operator role.');
      throw new ApiError(r.status, r.status === 401 ? 'a valid operator token is required' : 'the operator role is required');
    }
    const text = await r.text();
    if (!r.ok) {
      let msg = r.status + ' ' + r.statusText;
      try { msg = JSON.parse(text).error.message || msg; } catch (e) { /* not JSON */ }
      throw new ApiError(r.status, msg);
    }
    return opts.text ? text : JSON.parse(text);
  }

  /* ---- token ---- */
  function showToken(why) {
    $('#token-panel').hidden = false;
    if (why) $('#token-why').textContent = why + ' It is kept in this tab only (sessionStorage) and sent as Authorization: Bearer.';
    $('#token-input').focus();
  }
  $('#token-toggle').addEventListener('click', () => {
    const p = $('#token-panel');
    p.hidden = !p.hidden;
    if (!p.hidden) $('#token-input').focus();
  });
  $('#token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    token = $('#token-input').value.trim();
    sessionStorage.setItem(TOKEN_KEY, token);
    $('#token-input').value = '';
    $('#token-panel').hidden = true;
    status('Token set.');
    route();
  });
  $('#token-clear').addEventListener('click', () => {
    token = '';
    sessionStorage.removeItem(TOKEN_KEY);
    status('Token forgotten.');
  });

  /* ---- formatting ---- */
  const usd = (v) => (typeof v === 'number' ? '$' + (v < 0.01 && v > 0 ? v.toPrecision(2) : v.toFixed(v < 10 ? 4 : 2)) : '–');
  function age(iso) {
    const t = Date.parse(iso);
    if (isNaN(t)) return '–';
    let s = Math.max(0, Math.round((Date.now() - t) / 1000));
    if (s < 60) return s + 's';
    if (s < 3600) return Math.floor(s / 60) + 'm';
    if (s < 86400) return Math.floor(s / 3600) + 'h' + String(Math.floor(s % 3600 / 60)).padStart(2, '0');
    return Math.floor(s / 86400) + 'd';
  }
  const short = (v, n) => { const s = typeof v === 'string' ? v : JSON.stringify(v); return s.length > n ? s.slice(0, n - 1) + '…' : s; };
  const badge = (cls, text) => el('span', { class: 'badge ' + cls, text });
  const runHref = (id) => '#/run/' + encodeURIComponent(id);
  const fileName = (id) => id.replace(/[^A-Za-z0-9._-]/g, '_').replace(/^\.+/, '_') || 'run';

  function download(name, text) {
    const url = URL.createObjectURL(new Blob([text], { type: 'application/x-ndjson' }));
    const a = el('a', { href: url, download: name });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }
  async function downloadRun(id, kind) {
    try {
      const text = await api('/v1/runs/' + encodeURIComponent(id) + '/' + kind, { text: true });
      download(fileName(id) + (kind === 'regression' ? '.jsonl' : '.trace.jsonl'), text);
      status('Downloaded ' + (kind === 'regression' ? 'the regression test' : 'the trace') + ' of ' + id + '.');
    } catch (e) { status(e.message, true); }
  }

  /* ---- runs ---- */
  function filters() {
    const q = new URLSearchParams({ limit: '500' });
    const st = $('#f-status').value, re = $('#f-reason').value.trim(), gr = $('#f-group').value.trim();
    if (st) q.set('status', st);
    if (re) q.set('reason', re);
    if (gr) q.set('group', gr);
    return q.toString();
  }
  async function loadRuns() {
    try {
      const d = await api('/v1/runs?' + filters());
      runs = d.runs || [];
      drawRuns();
      $('#runs-live').textContent = 'live, every ' + POLL_MS / 1000 + ' s · ' + new Date().toLocaleTimeString();
      if ($('#status').classList.contains('error')) status('');
    } catch (e) { status(e.message, true); }
  }
  function drawRuns() {
    const pages = Math.max(1, Math.ceil(runs.length / PAGE));
    page = Math.min(page, pages - 1);
    const body = $('#runs-table tbody');
    body.replaceChildren();
    for (const r of runs.slice(page * PAGE, page * PAGE + PAGE)) {
      const env = r.envelope || {}, k = r.counters || env.counters || {};
      const why = r.terminal_reason ? (env.guard ? env.guard + ': ' : '') + r.terminal_reason : '–';
      body.append(el('tr', { 'data-run': r.run_id },
        el('td', {}, el('a', { href: runHref(r.run_id), text: r.run_id })),
        el('td', {}, badge('s-' + r.status, r.status)),
        el('td', { text: why }),
        el('td', { class: 'num', text: k.steps ?? '–' }),
        el('td', { class: 'num', text: usd(k.cost_usd) }),
        el('td', { class: 'num', text: k.tokens ?? '–' }),
        el('td', { text: r.group || '–' }),
        el('td', { title: r.created_at, text: age(r.created_at) })));
    }
    if (!runs.length) body.append(el('tr', {}, el('td', { colspan: '8', class: 'muted', text: 'No runs match.' })));
    $('#page-info').textContent = runs.length ? 'page ' + (page + 1) + ' of ' + pages + ' · ' + runs.length + ' runs' : '';
    $('#prev').disabled = page === 0;
    $('#next').disabled = page >= pages - 1;
  }
  $('#filters').addEventListener('submit', (ev) => { ev.preventDefault(); page = 0; loadRuns(); });
  $('#prev').addEventListener('click', () => { page--; drawRuns(); });
  $('#next').addEventListener('click', () => { page++; drawRuns(); });

  /* ---- one run ---- */
  function parseTrace(text) {
    const out = [];
    let expect = null;
    text.split('\n').forEach((line, i) => {
      const t = line.trim();
      if (t.startsWith('# expect')) { try { expect = JSON.parse(t.slice(8)); } catch (e) { /* ignore */ } return; }
      if (!t.startsWith('{')) return;
      try { const ev = JSON.parse(t); ev._line = i + 1; out.push(ev); } catch (e) { /* skip */ }
    });
    return { events: out, expect };
  }
  function fact(dl, k, v) { if (v !== undefined && v !== null && v !== '') dl.append(el('dt', { text: k }), el('dd', {}, v)); }

  /* One run's page: its three requests, drawn when all came, unless another
   * run was asked for meanwhile (`shown` counts the asks: a slow answer of
   * the run left behind draws nothing over the one shown now). */
  async function loadRun(id) {
    const mine = ++shown;
    current = null;
    $('#run-h').textContent = 'Run ' + id;
    $('#timeline').replaceChildren();
    $('#run-facts').replaceChildren();
    $('#envelope').textContent = '';
    $('#cost-chart').replaceChildren();
    $('#kill-confirm').hidden = true;
    $('#kill-reason').value = 'operator_cancelled_loop';
    let run, trace = '', reg = null;
    try {
      run = await api('/v1/runs/' + encodeURIComponent(id));
    } catch (e) { if (mine === shown) status(e.message, true); return; }
    try { trace = await api('/v1/runs/' + encodeURIComponent(id) + '/trace', { text: true }); } catch (e) { if (mine === shown) status(e.message, true); }
    try { reg = parseTrace(await api('/v1/runs/' + encodeURIComponent(id) + '/regression', { text: true })).expect; } catch (e) { /* older server */ }
    if (mine !== shown) return; /* another run was asked for meanwhile */
    current = run;
    const env = run.envelope || {}, k = run.counters || env.counters || {};
    const dl = $('#run-facts');
    fact(dl, 'Status', badge('s-' + run.status, run.status));
    fact(dl, 'Reason', run.terminal_reason || null);
    fact(dl, 'Guard', env.guard || null);
    fact(dl, 'Message', env.message || null);
    fact(dl, 'Next', env.next_allowed_action || null);
    fact(dl, 'Group', run.group || null);
    fact(dl, 'Counters', (k.steps ?? 0) + ' steps, ' + (k.calls ?? 0) + ' calls (' + (k.blocked ?? 0) + ' blocked, ' +
      (k.replayed ?? 0) + ' replayed), ' + (k.model_calls ?? 0) + ' model calls, ' + (k.tokens ?? 0) + ' tokens, ' + usd(k.cost_usd));
    fact(dl, 'Created', run.created_at + ' (' + age(run.created_at) + ' ago)');
    if (env.refused_call) fact(dl, 'Refused call', env.refused_call.tool + ' ' + (env.refused_call.key_material || ''));
    $('#envelope').textContent = JSON.stringify(env, null, 2);
    $('#kill-run').disabled = run.status !== 'active';
    $('#kill-group').disabled = !run.group;
    drawTimeline(parseTrace(trace).events, reg, env);
  }

  /* A call's arguments with every object's keys in order: the guard counts
   * {"a":1,"b":2} and {"b":2,"a":1} as one call (a policy's loop_key
   * normalizers are not applied here). */
  function canonical(v) {
    if (Array.isArray(v)) return '[' + v.map(canonical).join(',') + ']';
    if (v && typeof v === 'object')
      return '{' + Object.keys(v).sort().map((k) => JSON.stringify(k) + ':' + canonical(v[k])).join(',') + '}';
    return JSON.stringify(v);
  }
  function drawTimeline(events, expect, env) {
    const ol = $('#timeline');
    const seen = new Map();
    let ncall = 0, stopped = false;
    const stopCall = expect && expect.stopped_at_call;
    /* The chart is what was spent: a model line the server wrote with a
     * `reservation` holds its worst case until its `usage` line settles
     * it at the real cost (trace-v1 as the server writes it); one without
     * (a trace written by hand) costs its own `cost` at once. */
    let cost = 0;
    const points = [[0, 0]], held = new Map();
    for (const ev of events) {
      const li = el('li', {}, el('span', { class: 'line', text: 'line ' + ev._line }));
      if (ev.type === 'call') {
        ncall++;
        const key = ev.tool + ' ' + canonical(ev.args || {});
        const rep = (seen.get(key) || 0) + 1;
        seen.set(key, rep);
        let action = expect ? (expect['call_' + ncall + '_action'] || (stopped ? 'not reached' : 'execute')) : null;
        if (action) li.append(badge('a-' + action.replace(' ', '-'), action), ' ');
        if (action === 'stop' || action === 'block') li.classList.add(action);
        li.append(el('strong', { text: ev.tool }), ' ', el('code', { text: short(ev.args || {}, 120) }));
        if (rep > 1) li.append(' ', el('span', { class: 'muted', text: '(identical call #' + rep + ')' }));
        if (ncall === stopCall && env) {
          if (typeof ev.t_ms === 'number') li.append(' ', el('span', { class: 'muted', text: '+' + ev.t_ms + ' ms' }));
          li.append(el('span', { class: 'msg', text: (env.terminal_reason || '') + (env.guard ? ' [' + env.guard + ']' : '') + ': “' + (env.message || '') + '”' }));
          stopped = true;
          ol.append(li);
          continue;
        }
      } else if (ev.type === 'result') {
        li.append(el('span', { class: 'muted', text: 'result ' }), el('strong', { text: ev.status || '(no status)' }));
        if (ev.value !== undefined) li.append(' ', el('code', { text: short(ev.value, 100) }));
      } else if (ev.type === 'model') {
        const reserved = typeof ev.reservation === 'number';
        if (reserved) held.set(ev.reservation, typeof ev.cost === 'number' ? ev.cost : 0);
        else if (typeof ev.cost === 'number') { cost += ev.cost; points.push([ev.t_ms || 0, cost]); }
        li.append(el('span', { class: 'muted', text: 'model ' }), el('strong', { text: ev.model || 'model call' }),
          ' ' + (ev.input_tokens ?? 0) + ' tokens in' + (ev.max_tokens ? ', up to ' + ev.max_tokens + ' out' : '') +
          (reserved ? ', up to ' : ', ') + usd(ev.cost ?? 0));
      } else if (ev.type === 'usage') {
        held.delete(ev.reservation);
        if (typeof ev.cost === 'number') { cost += ev.cost; points.push([ev.t_ms || 0, cost]); }
        li.append(el('span', { class: 'muted', text: 'usage ' }), (ev.input_tokens ?? 0) + ' in / ' + (ev.output_tokens ?? 0) + ' out' +
          (typeof ev.cost === 'number' ? ', ' + usd(ev.cost) : ''));
      } else if (ev.type === 'resume') {
        stopped = false; /* the run goes on: later calls were reached */
        li.append(el('strong', { text: 'resumed by an operator' }),
          ev.note ? ': ' + ev.note : '', ev.progress_version !== undefined ? ' (progress_version ' + ev.progress_version + ')' : '');
      } else if (ev.type === 'run') {
        li.append(el('strong', { text: 'run started' }), ev.group ? ' in group ' + ev.group : '');
      } else if (ev.type === 'cancel') {
        li.classList.add('stop');
        li.append(badge('a-stop', 'stop'), ' ', el('strong', { text: 'cancelled by an operator' }), ': ' + (ev.reason || 'operator_cancelled_loop'));
      } else if (ev.type === 'handoff') {
        li.append(el('strong', { text: 'handoff' }), ' ' + ev.from + ' → ' + ev.to);
      } else if (ev.type === 'budget') {
        li.classList.add('stop');
        li.append(el('strong', { text: 'refused by budget' }), ' ' + ev.scope + ' (' + ev.limit_source + ')');
      } else {
        li.append(el('strong', { text: ev.type }), ' ', el('code', { text: short(ev.text || ev.world || '', 100) }));
      }
      if (typeof ev.t_ms === 'number') li.append(' ', el('span', { class: 'muted', text: '+' + ev.t_ms + ' ms' }));
      ol.append(li);
    }
    if (!events.length) ol.append(el('li', { class: 'muted', text: 'No trace lines for this run.' }));
    if (expect) ol.append(el('li', { class: expect.terminal_reason ? 'stop' : '' }, el('span', { class: 'line', text: 'replay' }),
      expect.terminal_reason ? 'replaying this trace stops it: ' + expect.terminal_reason + (expect.stopped_at_call ? ' at call ' + expect.stopped_at_call : '')
        : 'replaying this trace does not stop it', ' (' + expect.executed_calls + ' executed, ' + expect.blocked_calls + ' blocked)'));
    drawCost(points, held);
  }

  function drawCost(points, held) {
    const box = $('#cost-chart');
    if (held.size) {
      const more = [...held.values()].reduce((a, b) => a + b, 0);
      box.append(el('p', { class: 'muted', text: held.size + ' model call' + (held.size > 1 ? 's' : '') +
        ' not settled yet: up to ' + usd(more) + ' more' }));
    }
    if (points.length < 2) { box.append(el('p', { class: 'muted', text: 'No paid model calls settled in this trace.' })); return; }
    const W = 600, H = 160, P = 30;
    const maxT = Math.max(1, ...points.map((p) => p[0])), maxC = Math.max(1e-9, ...points.map((p) => p[1]));
    const s = svg('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': 'Cost over time, up to ' + usd(maxC) });
    s.append(svg('line', { x1: P, y1: H - P, x2: W - 5, y2: H - P, class: 'axis' }), svg('line', { x1: P, y1: 5, x2: P, y2: H - P, class: 'axis' }));
    const xy = (p) => (P + (W - P - 5) * p[0] / maxT).toFixed(1) + ',' + (H - P - (H - P - 5) * p[1] / maxC).toFixed(1);
    s.append(svg('polyline', { points: points.map(xy).join(' '), class: 'cost' }));
    const t1 = svg('text', { x: P + 2, y: 14 }); t1.textContent = usd(maxC);
    const t2 = svg('text', { x: W - 60, y: H - 10 }); t2.textContent = (maxT / 1000).toFixed(1) + ' s';
    s.append(t1, t2);
    box.append(s);
  }

  /* ---- the kill switch: one confirmation ---- */
  function askKill(kind) {
    if (!current) return;
    const reason = $('#kill-reason').value.trim() || 'operator_cancelled_loop';
    pending = { kind, reason, id: current.run_id, group: current.group };
    $('#kill-what').textContent = kind === 'group' ? 'Cancel every run of group ' + current.group + ' (' + reason + ')?'
      : 'Cancel run ' + current.run_id + ' (' + reason + ')? Its next call, from any worker, gets stop.';
    $('#kill-confirm').hidden = false;
    $('#kill-yes').focus();
  }
  $('#kill-form').addEventListener('submit', (ev) => { ev.preventDefault(); askKill('run'); });
  $('#kill-group').addEventListener('click', () => askKill('group'));
  $('#kill-no').addEventListener('click', () => { pending = null; $('#kill-confirm').hidden = true; $('#kill-run').focus(); });
  $('#kill-yes').addEventListener('click', async () => {
    if (!pending) return;
    const p = pending;
    pending = null;
    $('#kill-confirm').hidden = true;
    try {
      if (p.kind === 'group') {
        const d = await api('/v1/groups/' + encodeURIComponent(p.group) + '/cancel', { method: 'POST', body: { reason: p.reason } });
        status('Cancelled group ' + p.group + ': ' + (d.cancelled || []).length + ' runs stopped now; later ones stop at their first call.');
      } else {
        await api('/v1/runs/' + encodeURIComponent(p.id) + '/cancel', { method: 'POST', body: { reason: p.reason } });
        status('Cancelled run ' + p.id + '.');
      }
      loadRun(p.id);
    } catch (e) { status(e.message, true); }
  });
  $('#dl-trace').addEventListener('click', () => current && downloadRun(current.run_id, 'trace'));
  $('#dl-regression').addEventListener('click', () => current && downloadRun(current.run_id, 'regression'));

  /* ---- incidents ---- */
  async function loadIncidents() {
    const box = $('#incidents');
    try {
      const d = await api('/v1/runs?status=stopped&limit=' + INCIDENTS);
      const by = new Map();
      for (const r of d.runs || []) {
        const k = r.terminal_reason || 'unknown';
        if (!by.has(k)) by.set(k, []);
        by.get(k).push(r);
      }
      box.replaceChildren();
      if (!by.size) box.append(el('p', { class: 'muted', text: 'No stopped runs.' }));
      if ((d.runs || []).length >= INCIDENTS) /* the counts are of these runs only: say so */
        box.append(el('p', { class: 'muted', text: 'The newest ' + INCIDENTS.toLocaleString('en') +
          ' stopped runs; older ones are not counted here (loopguard runs list --status stopped --limit N lists more).' }));
      for (const [reason, list] of [...by.entries()].sort((a, b) => b[1].length - a[1].length)) {
        const g = el('section', { class: 'group' }, el('h3', { text: reason + ' (' + list.length + ')' }));
        for (const r of list.slice(0, 50)) {
          g.append(el('div', { class: 'incident' },
            el('a', { href: runHref(r.run_id), text: r.run_id }),
            el('span', { class: 'muted', text: (r.group ? r.group + ' · ' : '') + age(r.updated_at) + ' ago' }),
            el('button', { type: 'button', class: 'ghost', onclick: () => downloadRun(r.run_id, 'regression'),
              'aria-label': 'Download ' + r.run_id + ' as a regression test', text: 'Download as regression test' })));
        }
        if (list.length > 50) g.append(el('p', { class: 'muted', text: '… and ' + (list.length - 50) + ' more (loopguard runs export --reason ' + reason + ')' }));
        box.append(g);
      }
    } catch (e) { status(e.message, true); }
  }

  /* ---- budgets ---- */
  function drawBudget(b) {
    const used = (b.spent_usd || 0) + (b.reserved_usd || 0);
    const m = el('meter', { min: '0', max: String(b.limit_usd || 0), value: String(used), high: String((b.limit_usd || 0) * 0.8),
      optimum: '0', 'aria-label': 'spent and reserved against the limit' });
    return el('div', { class: 'budget', 'data-scope': b.scope }, el('h3', { text: b.scope }), m,
      el('p', { text: usd(b.spent_usd) + ' spent + ' + usd(b.reserved_usd) + ' reserved of ' + usd(b.limit_usd) +
        ' (' + (b.limit_usd ? Math.round(100 * used / b.limit_usd) : 0) + '%), ' + b.period +
        (b.resets_at ? '; resets at ' + b.resets_at : '; never resets') }));
  }
  async function loadBudgets() {
    const box = $('#budgets');
    try {
      const d = await api('/v1/budgets');
      const list = Array.isArray(d) ? d : d.budgets || [];
      box.replaceChildren(...list.map(drawBudget));
      if (!list.length) box.append(el('p', { class: 'muted', text: 'No budgets set.' }));
    } catch (e) {
      if (e.code !== 404 && e.code !== 405) status(e.message, true);
      else box.replaceChildren(el('p', { class: 'muted', text: 'Name a scope to see its budget.' }));
    }
  }
  $('#budget-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const scope = $('#budget-scope').value.trim();
    try {
      const b = await api('/v1/budgets/' + encodeURIComponent(scope));
      for (const old of $('#budgets').querySelectorAll('.budget'))
        if (old.dataset.scope === b.scope) old.remove(); /* shown once, as it is now */
      $('#budgets').prepend(drawBudget(b));
    } catch (e) { status(e.message, true); }
  });

  /* ---- navigation ---- */
  function show(name) {
    for (const v of document.querySelectorAll('.view')) v.hidden = v.id !== 'view-' + name;
    for (const a of document.querySelectorAll('[data-nav]'))
      if (a.dataset.nav === name || (name === 'run' && a.dataset.nav === 'runs')) a.setAttribute('aria-current', 'page');
      else a.removeAttribute('aria-current');
  }
  function route() {
    clearInterval(timer);
    timer = null;
    const h = location.hash || '#/runs';
    if (h.startsWith('#/run/')) {
      show('run');
      loadRun(decodeURIComponent(h.slice(6)));
    } else if (h === '#/incidents') {
      show('incidents');
      loadIncidents();
    } else if (h === '#/budgets') {
      show('budgets');
      loadBudgets();
    } else {
      show('runs');
      loadRuns();
      timer = setInterval(() => { if (!document.hidden) loadRuns(); }, POLL_MS);
    }
  }
  window.addEventListener('hashchange', route);
  route();
})();
