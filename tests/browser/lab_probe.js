// What the browser test reads from JupyterLab's page: installed on every page as window.__minillm.
// Read-only except for one data attribute (data-minillm-ran) it puts on code cells it saw queued
// or running, so the test knows which cells Run All has really executed in this session.
(() => {
  const panel = () => document.querySelector('#jp-main-dock-panel .jp-NotebookPanel:not(.lm-mod-hidden)');
  const cellNodes = () => {
    const p = panel();
    return p ? Array.from(p.querySelectorAll('.jp-Notebook .jp-Cell')) : [];
  };
  const kind = (c) => c.classList.contains('jp-CodeCell') ? 'code'
    : c.classList.contains('jp-MarkdownCell') ? 'markdown' : 'raw';
  const prompt = (c) => {
    const p = c.querySelector('.jp-InputArea-prompt, .jp-InputPrompt');
    return p ? p.textContent.trim() : '';
  };
  const markRunning = () => {
    for (const c of cellNodes()) {
      if (kind(c) === 'code' && prompt(c).includes('*')) c.dataset.minillmRan = '1';
    }
  };
  window.__minillm = {
    // The notebook toolbar: the kernel's display name and the execution indicator's status.
    toolbar() {
      const p = panel();
      if (!p) return { open: false };
      const name = p.querySelector('.jp-NotebookPanel-toolbar .jp-KernelName');
      const ind = p.querySelector('.jp-NotebookPanel-toolbar .jp-Notebook-ExecutionIndicator');
      // The status bar: "minillm (.venv) | Idle", and "Cell 3/23" (23: the cells of the notebook's model,
      // which JupyterLab attaches to the page a few at a time).
      const texts = Array.from(document.querySelectorAll('#jp-main-statusbar .jp-StatusBar-TextItem'))
        .map((e) => e.textContent.trim());
      const count = texts.map((t) => /^Cell \d+\/(\d+)$/.exec(t)).find((m) => m);
      return {
        open: true,
        kernelName: name ? name.textContent.trim() : null,
        status: ind ? ind.getAttribute('data-status') : null,
        statusBar: texts.find((t) => t.includes(' | ')) || null,
        cells: cellNodes().length,
        modelCells: count ? Number(count[1]) : null,
      };
    },
    // Every cell, in order: its kind, its prompt ("[3]:", "[*]:", "[ ]:"), whether Run All ran it,
    // the first line of its source, and its outputs (mime type and text, textContent so that cells
    // outside the viewport read the same as those inside it).
    cells(maxText) {
      return cellNodes().map((c, index) => {
        const line = c.querySelector('.jp-InputArea-editor .cm-line');
        return {
          index,
          kind: kind(c),
          prompt: prompt(c),
          ran: c.dataset.minillmRan === '1',
          firstLine: line ? line.textContent : '',
          outputs: Array.from(c.querySelectorAll('.jp-OutputArea-output')).map((o) => ({
            mime: o.getAttribute('data-mime-type') || '',
            text: (o.textContent || '').slice(0, maxText || 20000),
            widget: !!o.querySelector('.jupyter-widgets, .widget-box, .widget-play'),
            still: !!o.querySelector('.widget-still'),
            visibleStep: (() => {
              const svg = Array.from(o.querySelectorAll('svg[data-step]')).find((s) => s.checkVisibility());
              return svg ? svg.getAttribute('data-step') : null;
            })(),
          })),
        };
      });
    },
    // From now on, note every code cell that shows "[*]" (queued or running).
    watchRuns() {
      const p = panel();
      if (!p) return false;
      if (window.__minillmObserver) window.__minillmObserver.disconnect();
      for (const c of cellNodes()) delete c.dataset.minillmRan;
      markRunning();
      window.__minillmObserver = new MutationObserver(markRunning);
      window.__minillmObserver.observe(p, { subtree: true, childList: true, characterData: true, attributes: false });
      return true;
    },
    markRunning,
    // The index of the cell holding this element.
    cellIndexOf(el) {
      return cellNodes().indexOf(el.closest('.jp-Cell'));
    },
    dialogs() {
      return Array.from(document.querySelectorAll('.jp-Dialog')).map((d) => {
        const part = (sel) => { const e = d.querySelector(sel); return e ? e.innerText.trim().replace(/\s+/g, ' ') : ''; };
        return [part('.jp-Dialog-header'), part('.jp-Dialog-body')].filter((t) => t).join(': ').slice(0, 300);
      });
    },
  };
})();
