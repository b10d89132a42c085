// The page as a list of elements an agent can read and act on. Ids live in data-tg attributes, so an
// element keeps its id for the whole page's life and a new element gets the next free number.
() => {
  const root = document.body;
  const skip = {query: 1, 'reward-display': 1, 'sync-task-cover': 1, 'episode-id': 1};
  if (window.__tgNext === undefined) window.__tgNext = 1;
  const out = [];
  const clean = (s) => (s || '').replace(/\s+/g, ' ').trim().slice(0, 200);
  const inputRole = {checkbox: 'checkbox', radio: 'radio', button: 'button', submit: 'button', reset: 'button',
                     range: 'slider', file: 'file', color: 'color', hidden: null};
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
  visit(root, false);
  const q = document.getElementById('query');
  return {
    elements: out,
    utterance: q ? clean(q.innerText) : '',
    done: typeof WOB_DONE_GLOBAL !== 'undefined' ? WOB_DONE_GLOBAL : false,
    reward: typeof WOB_REWARD_GLOBAL !== 'undefined' ? WOB_REWARD_GLOBAL : 0,
    raw_reward: typeof WOB_RAW_REWARD_GLOBAL !== 'undefined' ? WOB_RAW_REWARD_GLOBAL : 0,
    reason: typeof WOB_REWARD_REASON !== 'undefined' && WOB_REWARD_REASON !== null ? String(WOB_REWARD_REASON) : null,
    scroll: [window.scrollX, window.scrollY],
  };
}
