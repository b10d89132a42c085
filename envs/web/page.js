// Installed in every MiniWoB page before its own scripts (a Playwright init script) as window.__toolgym.
// Each env call is ONE page.evaluate that does the action in the page and returns the page afterwards, so
// a step costs one or two browser round trips instead of Playwright's per-action handle, actionability and
// snapshot trips. Ids live in data-tg attributes: an element keeps its id for the page's life and a new
// element gets the next free number.
(() => {
  if (window.__toolgym) return;
  const tg = {};
  const skip = {query: 1, 'reward-display': 1, 'sync-task-cover': 1, 'episode-id': 1};
  const clean = (s) => (s || '').replace(/\s+/g, ' ').trim().slice(0, 200);
  const inputRole = {checkbox: 'checkbox', radio: 'radio', button: 'button', submit: 'button', reset: 'button',
                     range: 'slider', file: 'file', color: 'color', hidden: null};
  const TEXT_TYPES = ['text', 'password', 'email', 'search', 'tel', 'url', 'number', ''];
  const VALUE_TYPES = ['date', 'time', 'datetime-local', 'month', 'week', 'color', 'range'];

  const roleOf = (el) => {
    const tag = el.tagName;
    if (tag === 'BUTTON') return 'button';
    if (tag === 'A') return 'link';
    if (tag === 'SELECT') return 'combobox';
    if (tag === 'TEXTAREA') return 'textbox';
    if (tag === 'INPUT') { const t = (el.type || 'text').toLowerCase(); return t in inputRole ? inputRole[t] : (t === 'text' ? 'textbox' : t); }
    const aria = el.getAttribute('role');
    if (aria) return aria;
    return null;
  };
  const labelOf = (el) => {
    if (el.id) { const l = document.querySelector('label[for="' + CSS.escape(el.id) + '"]'); if (l) return clean(l.innerText); }
    const wrap = el.closest('label');
    if (wrap) return clean(wrap.innerText);
    return clean(el.getAttribute('aria-label') || el.getAttribute('placeholder') || el.getAttribute('title') || '');
  };
  const ownText = (el) => {
    let t = '';
    el.childNodes.forEach((c) => { if (c.nodeType === 3) t += ' ' + c.textContent; });
    return clean(t);
  };
  const idOf = (el) => { if (!el.dataset.tg) el.dataset.tg = String(window.__tgNext++); return Number(el.dataset.tg); };

  // The page as a list of elements an agent can read and act on, plus MiniWoB's episode state.
  tg.snapshot = () => {
    if (window.__tgNext === undefined) window.__tgNext = 1;
    const out = [];
    const visit = (el, inLabelled) => {
      if (skip[el.id] || el.tagName === 'SCRIPT' || el.tagName === 'STYLE') return;
      const style = getComputedStyle(el);
      if (style.display === 'none') return;
      const rect = el.getBoundingClientRect();
      const shown = style.visibility !== 'hidden' && rect.width > 0 && rect.height > 0;
      const role = roleOf(el);
      if (shown) {
        if (role) {
          const item = {id: idOf(el), role: role, tag: el.tagName.toLowerCase()};
          if (role === 'button' || role === 'link') {
            item.text = clean(el.innerText || el.value || el.getAttribute('title') || el.getAttribute('aria-label'));
          } else if (!['INPUT', 'TEXTAREA', 'SELECT'].includes(el.tagName)) {
            item.text = ownText(el);
            if (!item.text && !['tab', 'menuitem', 'option', 'treeitem', 'checkbox', 'radio', 'switch', 'slider'].includes(role)) {
              for (const child of el.children) visit(child, inLabelled);
              return;
            }
          } else {
            item.text = labelOf(el);
          }
          if (el.tagName === 'INPUT' || el.tagName === 'TEXTAREA' || el.tagName === 'SELECT') {
            if (role !== 'checkbox' && role !== 'radio' && role !== 'button') item.value = el.value;
            if (el.type === 'checkbox' || el.type === 'radio') item.checked = el.checked;
          }
          if (el.tagName === 'SELECT') item.options = Array.from(el.options).map((o) => clean(o.text));
          if (el.disabled) item.disabled = true;
          if (el.readOnly) item.readonly = true;
          if (document.activeElement === el) item.focused = true;
          out.push(item);
          if (role === 'combobox') return;
          inLabelled = inLabelled || role === 'button' || role === 'link';
        } else if (!inLabelled && el.tagName !== 'LABEL') {
          const text = ownText(el);
          if (text) out.push({id: idOf(el), role: 'text', tag: el.tagName.toLowerCase(), text: text});
        } else if (el.tagName === 'LABEL' && !el.control) {
          const text = ownText(el);
          if (text) out.push({id: idOf(el), role: 'text', tag: 'label', text: text});
        }
      }
      for (const child of el.children) visit(child, inLabelled);
    };
    if (document.body) visit(document.body, false);
    const q = document.getElementById('query');
    return {
      elements: out,
      utterance: q ? clean(q.innerText) : '',
      done: typeof WOB_DONE_GLOBAL !== 'undefined' ? WOB_DONE_GLOBAL : false,
      reward: typeof WOB_REWARD_GLOBAL !== 'undefined' ? WOB_REWARD_GLOBAL : 0,
      raw_reward: typeof WOB_RAW_REWARD_GLOBAL !== 'undefined' ? WOB_RAW_REWARD_GLOBAL : 0,
      reason: typeof WOB_REWARD_REASON !== 'undefined' && WOB_REWARD_REASON !== null ? String(WOB_REWARD_REASON) : null,
    };
  };

  class ActionError extends Error {}
  const fail = (text) => { throw new ActionError(text); };
  const find = (id) => {
    const n = Number(id);
    if (!Number.isInteger(n)) fail(`${JSON.stringify(id)} is not an element id (ids are the numbers in brackets)`);
    const el = document.querySelector(`[data-tg="${n}"]`);
    if (!el) fail(`there is no element [${n}] on the page now (it may have gone)`);
    return el;
  };
  const frame = () => new Promise((r) => { requestAnimationFrame(() => r()); setTimeout(r, 50); });
  // A finite animation runs (jQuery's effects, CSS transitions): MiniWoB's datepicker fades in, its
  // accordion slides. Clicking mid-animation would hit a moving target (Playwright waits for "stable").
  const animating = () => (window.jQuery && jQuery.timers && jQuery.timers.length > 0) ||
    document.getAnimations().some((a) => a.playState === 'running' && a.effect &&
                                         a.effect.getComputedTiming().endTime !== Infinity);
  const settle = async (ms) => { const end = performance.now() + ms; while (animating() && performance.now() < end) await frame(); };
  const describe = (el) => {
    if (!el) return 'nothing';
    const id = el.dataset && el.dataset.tg ? `[${el.dataset.tg}] ` : '';
    return `${id}<${el.tagName.toLowerCase()}>`;
  };
  const inView = (r) => r.bottom > 0 && r.right > 0 && r.top < innerHeight && r.left < innerWidth;

  // Where a real mouse click on element `id` lands: scrolled into view, the centre of its first visible
  // box, hit-tested (the element, a descendant or its label must be on top there).
  const point = async (id, waitMs) => {
    const el = find(id);
    await settle(waitMs);
    if (el.disabled) fail(`element [${id}] is disabled`);
    let rects = Array.from(el.getClientRects()).filter((r) => r.width > 0 && r.height > 0);
    if (!rects.length) fail(`element [${id}] is not visible`);
    if (!rects.some(inView)) {
      el.scrollIntoView({block: 'center', inline: 'center'});
      rects = Array.from(el.getClientRects()).filter((r) => r.width > 0 && r.height > 0);
    }
    const r = rects.find(inView) || rects[0];
    const clamp = (v, hi) => Math.min(Math.max(v, 0), hi - 1);
    const reaches = (hit) => hit && (el.contains(hit) || hit.control === el ||
      (el.tagName === 'LABEL' && el.control === hit) || (hit.tagName === 'LABEL' && hit.contains(el)));
    // The centre, else the first point of a grid over the box that is not covered (a person clicks the
    // part of a half-hidden button they can see; Playwright gives up on a covered centre).
    const points = [[0.5, 0.5]];
    for (const fy of [0.2, 0.35, 0.5, 0.65, 0.8]) for (const fx of [0.2, 0.35, 0.5, 0.65, 0.8]) points.push([fx, fy]);
    let x = 0, y = 0, first = null;
    for (const [fx, fy] of points) {
      x = clamp(r.left + r.width * fx, innerWidth); y = clamp(r.top + r.height * fy, innerHeight);
      const hit = document.elementFromPoint(x, y);
      if (reaches(hit)) { first = null; break; }
      if (first === null) first = [hit, x, y];
    }
    if (first) fail(`element [${id}] is covered by ${describe(first[0])} at (${Math.round(first[1])}, ${Math.round(first[2])})`);
    // The page after the click: armed now, read once the mouse-up's task (and with it the click) is over.
    tg.clicked = new Promise((resolve) => {
      const after = () => setTimeout(resolve, 0);
      window.addEventListener('mouseup', after, {capture: true, once: true});
      setTimeout(resolve, 2000);  // no mouse-up came (the click failed): read the page anyway
    }).then(() => JSON.stringify({error: null, snapshot: tg.snapshot()}));
    return [x, y];
  };

  const type = (id, text) => {
    const el = find(id);
    const kind = (el.type || '').toLowerCase();
    const field = (el.tagName === 'INPUT' && (TEXT_TYPES.includes(kind) || VALUE_TYPES.includes(kind))) ||
                  el.tagName === 'TEXTAREA' || el.isContentEditable;
    if (!field) fail(`element [${id}] is not a text field`);
    if (el.disabled) fail(`element [${id}] is disabled`);
    if (el.readOnly) fail(`element [${id}] is read-only`);
    el.focus();
    if (VALUE_TYPES.includes(kind)) {  // no caret: the value is set whole, as a browser's picker does
      el.value = text;
      if (el.value !== text) fail(`${JSON.stringify(text)} is not a valid ${kind} (e.g. ${kind === 'date' ? '2024-01-31' : kind === 'time' ? '13:05' : 'a valid value'})`);
    } else {
      // execCommand edits like typing does (beforeinput/input events, undo stack); the value path is
      // the fallback for fields it does not reach.
      if (el.isContentEditable) { const r = document.createRange(); r.selectNodeContents(el); const s = getSelection(); s.removeAllRanges(); s.addRange(r); }
      else { try { el.select(); } catch (e) { /* number fields have no selection */ } }
      const done = text === '' ? document.execCommand('delete') : document.execCommand('insertText', false, text);
      const now = el.isContentEditable ? el.innerText : el.value;
      if (!done || now !== text) {
        if (el.isContentEditable) el.innerText = text; else el.value = text;
        el.dispatchEvent(new Event('input', {bubbles: true}));
      }
      return;
    }
    el.dispatchEvent(new Event('input', {bubbles: true}));
    el.dispatchEvent(new Event('change', {bubbles: true}));
  };

  const select = (id, option) => {
    const el = find(id);
    if (el.tagName !== 'SELECT') fail(`element [${id}] is not a dropdown (use click for other elements)`);
    if (el.disabled) fail(`element [${id}] is disabled`);
    const opts = Array.from(el.options);
    const want = String(option);
    const match = opts.find((o) => clean(o.text) === want || o.value === want) ||
                  opts.find((o) => clean(o.text).toLowerCase() === want.toLowerCase());
    if (!match) fail(`[${id}] has no option ${JSON.stringify(want)}; options: ${JSON.stringify(opts.map((o) => clean(o.text)))}`);
    el.focus();
    opts.forEach((o) => { o.selected = o === match; });
    el.dispatchEvent(new Event('input', {bubbles: true}));
    el.dispatchEvent(new Event('change', {bubbles: true}));
  };

  // One step done in the page: returns {error, snapshot}, or for 'point' (a mouse click the caller sends
  // as real input) {point} when the element can be clicked.
  // Results travel as one JSON string: cheaper for Playwright's value serialisers on both ends.
  tg.act = async (name, args, waitMs) => {
    try {
      if (name === 'point') return JSON.stringify({point: await point(args[0], waitMs)});
      if (name === 'type') type(args[0], String(args[1]));
      else if (name === 'select') select(args[0], args[1]);
      else if (name === 'scroll') find(args[1]).scrollBy(args[0][0] * 100, args[0][1] * 100);
      else if (name !== 'snapshot') fail(`unknown action ${JSON.stringify(name)}`);
      return JSON.stringify({error: null, snapshot: tg.snapshot()});
    } catch (e) {
      if (!(e instanceof ActionError)) throw e;
      return JSON.stringify({error: e.message, snapshot: tg.snapshot()});
    }
  };

  // The page once the click armed by the last 'point' is over.
  tg.afterClick = () => tg.clicked || JSON.stringify({error: null, snapshot: tg.snapshot()});

  // Every form control as the page loaded it. A control the model typed into keeps its value (its "dirty"
  // flag) when a task sets its text the way a page load does (scroll-text's textarea.innerHTML): the next
  // episode showed the last one's text, not its own. A form reset clears the flag; each control is moved into
  // a form of its own for it (listeners stay), and the task's genProblem then fills them.
  tg.resetControls = () => {
    for (const form of document.querySelectorAll('form')) HTMLFormElement.prototype.reset.call(form);
    for (const control of document.querySelectorAll('textarea, input, select')) {
      if (control.form) continue;
      const mark = document.createComment('tg');
      const holder = document.createElement('form');
      control.replaceWith(mark);
      holder.appendChild(control);
      HTMLFormElement.prototype.reset.call(holder);
      mark.replaceWith(control);
    }
  };

  // Start a seeded episode through MiniWoB's own JavaScript and return its first page once it is ready.
  tg.start = async (seed, maxTime) => {
    if (core.EP_TIMER !== null) { clearTimeout(core.EP_TIMER); core.EP_TIMER = null; }
    document.querySelectorAll('[data-tg]').forEach((e) => e.removeAttribute('data-tg'));
    window.__tgNext = 1;
    if (document.activeElement && document.activeElement.blur) document.activeElement.blur();
    tg.resetControls();
    Math.seedrandom(seed);
    core.EPISODE_MAX_TIME = maxTime;
    core.startEpisodeReal();
    // Without an episode clock the countdown display only repaints every page once a second: stop it.
    if (maxTime >= 1e9) core.clearTimer();
    const end = performance.now() + 30000;
    while (typeof WOB_TASK_READY !== 'undefined' && !WOB_TASK_READY) {
      if (performance.now() > end) return JSON.stringify({error: 'the task did not become ready within 30 s'});
      await new Promise((r) => setTimeout(r, 5));
    }
    return JSON.stringify({error: null, snapshot: tg.snapshot()});
  };

  Object.defineProperty(window, '__toolgym', {value: tg});
})();
