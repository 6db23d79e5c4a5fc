// console.test.mjs — the operator's console in a real browser (Debian's
// chromium, driven by playwright-core; no browser download). Run by
// tests/cli/console_browser.sh, which starts `loopguard serve` with tokens
// on and a temp SQLite store, makes a stopped run and a live one, and
// passes: LG_URL, LG_OPERATOR_TOKEN, LG_AGENT_TOKEN, LG_ARTIFACTS.
//
// Checks: without a token the page asks for one and the API refuses it;
// with it, the runs list shows the run the guard stopped; its timeline
// shows the stopping call; the regression download starts with # expect;
// the kill switch cancels the live run (asserted through the API: its next
// call is `stop`); incidents and budgets render; the page is readable at a
// phone's width; no Content-Security-Policy violation. Screenshots go to
// LG_ARTIFACTS. Prints "N passed, N failed"; exit 1 on any failure.
import { chromium } from 'playwright-core';
import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

const URL = process.env.LG_URL, OP = process.env.LG_OPERATOR_TOKEN, AG = process.env.LG_AGENT_TOKEN;
const ART = process.env.LG_ARTIFACTS || 'artifacts';
mkdirSync(ART, { recursive: true });
let passed = 0, failed = 0;
const check = (name, cond, detail) => {
  if (cond) passed++;
  else { failed++; console.log('FAIL: ' + name + (detail !== undefined ? ': ' + detail : '')); }
};
const hard = setTimeout(() => { console.log('FAIL: timed out after 50 s'); console.log(`${passed} passed, ${failed + 1} failed`); process.exit(1); }, 50000);

const browser = await chromium.launch({
  executablePath: process.env.LG_CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  // A fresh, empty --user-data-dir: playwright makes one per launch (a temp dir it removes).
  timeout: 20000,
});
const cspErrors = [];
try {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 860 }, acceptDownloads: true });
  const page = await ctx.newPage();
  page.setDefaultTimeout(8000);
  page.on('console', (m) => { if (/Content Security Policy|Refused to/.test(m.text())) cspErrors.push(m.text()); });
  const statuses = [];
  page.on('response', (r) => { if (r.url().includes('/v1/')) statuses.push(r.status()); });

  // 1. No token: the page asks for one, the API refused.
  const resp = await page.goto(URL + '/');
  check('console answers 200', resp.status() === 200, resp.status());
  const csp = resp.headers()['content-security-policy'] || '';
  check('strict CSP header', csp.includes("default-src 'none'") && csp.includes("script-src 'self'") && csp.includes("frame-ancestors 'none'"), csp);
  await page.waitForSelector('#token-panel:not([hidden])');
  check('API refused without a token', statuses.includes(401), statuses.join(','));
  check('no run shown without a token', (await page.locator('#runs-table tbody tr[data-run]').count()) === 0);
  check('the token field has focus', await page.evaluate(() => document.activeElement && document.activeElement.id === 'token-input'));
  await page.screenshot({ path: join(ART, 'console-no-token.png') });

  // 2. With the token: the stopped run is listed, newest first.
  await page.fill('#token-input', OP);
  await page.keyboard.press('Enter');
  const row = page.locator('tr[data-run="loop-1"]');
  await row.waitFor();
  const rowText = await row.innerText();
  check('stopped run listed', /stopped/.test(rowText) && /same_call_repeat/.test(rowText), rowText);
  check('guard shown', /repeat: same_call_repeat/.test(rowText), rowText);
  const ids = await page.locator('#runs-table tbody tr[data-run]').evaluateAll((rs) => rs.map((r) => r.dataset.run));
  check('newest first', ids.indexOf('live-1') < ids.indexOf('loop-1') && ids.includes('loop-1'), ids.join(','));
  const liveCells = await page.locator('tr[data-run="live-1"] td').allInnerTexts();
  check('an active run shows its steps', liveCells[3] === '1', liveCells.join(' | '));
  check('token kept in sessionStorage, not a cookie',
    (await page.evaluate(() => sessionStorage.getItem('loopguard.token'))) === OP && (await ctx.cookies()).length === 0);
  await page.selectOption('#f-status', 'stopped');
  await page.click('#filters button[type=submit]');
  await page.waitForFunction(() => !document.querySelector('tr[data-run="live-1"]'));
  check('status filter', (await page.locator('tr[data-run="loop-1"]').count()) === 1);
  await page.screenshot({ path: join(ART, 'console-runs.png') });

  // 3. The stopped run's timeline, by keyboard.
  await page.locator('tr[data-run="loop-1"] a').focus();
  await page.keyboard.press('Enter');
  await page.waitForSelector('#timeline li.stop');
  const stopLi = await page.locator('#timeline li.stop').first().innerText();
  check('timeline shows the stopping call', /stop/.test(stopLi) && /charge_invoice/.test(stopLi) && /identical call #6/.test(stopLi), stopLi);
  check('timeline shows the message', /same arguments 6 times/.test(stopLi), stopLi);
  check('blocked calls marked', (await page.locator('#timeline li.block').count()) === 3);
  check('envelope shown', /"terminal_reason": "same_call_repeat"/.test(await page.locator('#envelope').textContent()));
  check('cost chart drawn', (await page.locator('#cost-chart svg polyline').count()) === 1);
  /* what was spent (each usage settles its model call's worst case), as the run's counters say */
  const chart = await page.locator('#cost-chart svg').getAttribute('aria-label');
  const facts = await page.locator('#run-facts').innerText();
  check('cost chart is the settled cost', chart === 'Cost over time, up to $0.0080' && facts.includes('$0.0080'), chart + ' | ' + facts);
  await page.screenshot({ path: join(ART, 'console-stopped-run.png'), fullPage: true });
  const [dl] = await Promise.all([page.waitForEvent('download'), page.click('#dl-regression')]);
  const text = readFileSync(await dl.path(), 'utf8');
  check('regression download has # expect', text.startsWith('# expect {"terminal_reason":"same_call_repeat","stopped_at_call":6'), text.slice(0, 120));
  check('download name', dl.suggestedFilename() === 'loop-1.jsonl', dl.suggestedFilename());
  await dl.saveAs(join(ART, 'loop-1.jsonl')); /* console_browser.sh runs `loopguard test` on it */

  // 3b. A run stopped, resumed and going on: the calls after the resume
  // were reached, the resume is shown with its note, identical calls are
  // counted whatever their keys' order.
  await page.goto(URL + '/#/run/again-1');
  await page.waitForSelector('#timeline li.stop');
  const tl = await page.locator('#timeline').innerText();
  check('calls after a resume are not "not reached"', !/not reached/.test(tl), tl);
  check('the resume and its note', /resumed by an operator: fixed the invoice/.test(tl), tl);
  check('identical calls whatever the keys\' order', /identical call #6/.test(await page.locator('#timeline li.stop').first().innerText()), tl);

  // 3c. Two runs asked for one after the other, the first answering
  // slowly: the page shows the second, not the first's late answer over it.
  await page.route('**/v1/runs/loop-1/trace', async (r) => { await new Promise((f) => setTimeout(f, 700)); await r.continue(); });
  await page.goto(URL + '/#/run/loop-1');
  await page.goto(URL + '/#/run/again-1');
  await page.waitForTimeout(1500);
  const factsNow = await page.locator('#run-facts').innerText(), tlNow = await page.locator('#timeline').innerText();
  check('a slow run left behind draws nothing over the next',
    (await page.locator('#run-h').innerText()) === 'Run again-1' && !/billing/.test(factsNow) && /resumed by an operator/.test(tlNow) &&
      (await page.locator('#timeline li.stop').count()) === 1, factsNow + ' | ' + tlNow.slice(0, 300));
  await page.unroute('**/v1/runs/loop-1/trace');

  // 4. The kill switch on the live run: one confirmation, then the API says stop.
  await page.goto(URL + '/#/run/live-1');
  await page.waitForSelector('#run-facts dd');
  check('no confirmation shown before asking', await page.locator('#kill-confirm').isHidden());
  await page.fill('#kill-reason', 'console_test_kill');
  await page.click('#kill-run');
  await page.waitForSelector('#kill-confirm:not([hidden])');
  check('confirm button focused', await page.evaluate(() => document.activeElement.id === 'kill-yes'));
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => /Cancelled run live-1/.test(document.querySelector('#status').textContent));
  const next = await fetch(URL + '/v1/runs/live-1/calls', { method: 'POST',
    headers: { Authorization: 'Bearer ' + AG, 'Content-Type': 'application/json' },
    body: JSON.stringify({ tool: 'search', args: { q: 'again' } }) }).then((r) => r.json());
  check('next call after the kill switch is stop', next.action === 'stop' && next.reason === 'operator_cancelled_loop' && next.operator_note === 'console_test_kill', JSON.stringify(next));
  await page.waitForFunction(() => /stopped/.test(document.querySelector('#run-facts').textContent));
  await page.screenshot({ path: join(ART, 'console-cancelled.png'), fullPage: true });

  // 5. Incidents, grouped by reason, each downloadable.
  await page.goto(URL + '/#/incidents');
  await page.waitForSelector('#incidents .group');
  const inc = await page.locator('#incidents').innerText();
  check('incidents grouped by reason', /same_call_repeat \(1\)/.test(inc) && /operator_cancelled_loop \(1\)/.test(inc), inc);
  check('incident download buttons', (await page.locator('#incidents button').count()) === 2);
  await page.screenshot({ path: join(ART, 'console-incidents.png'), fullPage: true });

  // 6. Budgets: spend against the limit.
  await page.goto(URL + '/#/budgets');
  await page.waitForSelector('#budgets .budget, #budgets p');
  const listed = await page.locator('#budgets').innerText();
  check('budgets listed (GET /v1/budgets) or a scope asked for', /workspace:acme/.test(listed) || /Name a scope/.test(listed), listed);
  await page.fill('#budget-scope', 'workspace:acme');
  await page.click('#budget-form button');
  await page.waitForSelector('#budgets .budget meter');
  const bud = await page.locator('#budgets .budget').first().innerText();
  check('budget shown', /workspace:acme/.test(bud) && /of \$5/.test(bud) && /daily/.test(bud) && /resets at/.test(bud), bud);
  await page.click('#budget-form button');
  await page.waitForTimeout(300);
  check('a budget shown again is shown once', (await page.locator('#budgets .budget[data-scope="workspace:acme"]').count()) === 1);
  await page.screenshot({ path: join(ART, 'console-budgets.png') });

  // 6b. More stopped runs than incidents reads (1,000): the page says its
  // counts are of the newest 1,000 (until session 41 it counted them as all).
  const post = (path, body, token) => fetch(URL + path, { method: 'POST',
    headers: { Authorization: 'Bearer ' + token, 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  for (let i = 0; i < 1000; i += 50)
    await Promise.all(Array.from({ length: 50 }, async (_, k) => {
      await post('/v1/runs', { run_id: 'bulk-' + (i + k) }, AG);
      await post('/v1/runs/bulk-' + (i + k) + '/cancel', { reason: 'bulk_test' }, OP);
    }));
  await page.goto(URL + '/#/incidents');
  await page.waitForFunction(() => /bulk-/.test(document.querySelector('#incidents').textContent)).catch(() => {});
  const many = await page.locator('#incidents').innerText();
  check('incidents say they count the newest 1,000', /The newest 1,000 stopped runs/.test(many), many.slice(0, 300));

  // 7. A phone's width: nothing wider than the screen.
  await page.setViewportSize({ width: 375, height: 800 });
  await page.goto(URL + '/#/run/loop-1');
  await page.waitForSelector('#timeline li.stop');
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  check('readable at 375 px (no horizontal overflow)', overflow <= 1, overflow);
  await page.goto(URL + '/#/run/' + 'r'.repeat(300));
  await page.waitForSelector('#timeline li');
  const overflowLong = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  check('a long run id and tool wrap at 375 px', overflowLong <= 1, overflowLong);
  await page.screenshot({ path: join(ART, 'console-phone.png'), fullPage: true });

  // 8. A wrong token is refused too.
  await page.evaluate(() => sessionStorage.setItem('loopguard.token', 'wrong'));
  await page.goto(URL + '/#/runs');
  await page.reload();
  await page.waitForSelector('#token-panel:not([hidden])');
  check('wrong token refused', /not accepted/.test(await page.locator('#token-why').innerText()));
  check('no CSP violation', cspErrors.length === 0, cspErrors.join(' | '));
} catch (e) {
  check('browser run', false, e && e.stack || e);
} finally {
  await browser.close().catch(() => {});
  clearTimeout(hard);
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
