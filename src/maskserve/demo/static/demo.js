// maskserve demo page: progressive enhancement only. Without JavaScript each form posts (to /demo,
// or /demo/score) and the server renders the whole page. With it, the same POST goes through
// fetch, and only that form's answer and error box are replaced from the server's HTML: no
// reload, the typed text stays where it is, and nothing is ever parsed as HTML except the
// server's own page.
(() => {
  "use strict";

  if (!window.fetch || !window.DOMParser || !window.URLSearchParams) return;

  // Each form, the regions of the page that answer it, the fields the server may mark invalid
  // (the first is the text box), and what its button says while it waits.
  const FORMS = [
    { form: "fill-form", result: "result", error: "form-error", fields: ["text", "top_k"], busy: "Filling in…" },
    {
      form: "score-form",
      result: "score-result",
      error: "score-error",
      fields: ["sentences", "metric"],
      busy: "Scoring…",
    },
  ];

  // Copy a region's content from the server's page into this one. The region element itself
  // stays, so screen readers keep announcing the live region.
  function swap(id, fresh) {
    const mine = document.getElementById(id);
    const theirs = fresh.getElementById(id);
    if (!mine || !theirs) return;
    mine.replaceChildren(...Array.from(theirs.childNodes, (node) => document.importNode(node, true)));
    mine.hidden = theirs.hidden;
  }

  function copyInvalid(fresh, fields) {
    for (const id of fields) {
      const mine = document.getElementById(id);
      const theirs = fresh.getElementById(id);
      if (!mine) continue;
      if (theirs && theirs.hasAttribute("aria-invalid")) mine.setAttribute("aria-invalid", "true");
      else mine.removeAttribute("aria-invalid");
    }
    const describedBy = fresh.getElementById(fields[0])?.getAttribute("aria-describedby");
    if (describedBy) document.getElementById(fields[0]).setAttribute("aria-describedby", describedBy);
  }

  // For answers that are not the page (a proxy's error, the server's JSON error shape).
  function showError(boxId, title, message) {
    const box = document.getElementById(boxId);
    const strong = document.createElement("strong");
    strong.className = "error-title";
    strong.textContent = title;
    const span = document.createElement("span");
    span.className = "error-message";
    span.textContent = message;
    box.replaceChildren(strong, span);
    box.hidden = false;
  }

  async function publicMessage(response) {
    try {
      const body = await response.json();
      if (body && typeof body.error === "string") return body.error;
    } catch (_) {
      // Not JSON: fall through to the status line.
    }
    return `The server answered ${response.status}. Your text is kept: try again.`;
  }

  function enhance(config) {
    const form = document.getElementById(config.form);
    if (!form) return;
    const submit = form.querySelector("button[type=submit]");
    const label = submit.querySelector(".label");
    const idleLabel = label.textContent;
    let inFlight = null;

    function setBusy(busy) {
      form.setAttribute("aria-busy", String(busy));
      document.getElementById(config.result).setAttribute("aria-busy", String(busy));
      submit.disabled = busy;
      label.textContent = busy ? config.busy : idleLabel;
    }

    async function send() {
      if (inFlight) inFlight.abort();
      const controller = new AbortController();
      inFlight = controller;
      setBusy(true);
      try {
        const response = await fetch(form.action, {
          method: "POST",
          body: new URLSearchParams(new FormData(form)),
          headers: { Accept: "text/html" },
          credentials: "same-origin",
          signal: controller.signal,
        });
        const type = response.headers.get("Content-Type") || "";
        if (!type.startsWith("text/html")) {
          showError(config.error, "Something went wrong", await publicMessage(response));
          return;
        }
        const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
        swap(config.result, fresh);
        swap(config.error, fresh);
        copyInvalid(fresh, config.fields);
        document.title = fresh.title;
      } catch (error) {
        if (error.name === "AbortError") return;
        showError(config.error, "Could not reach the server", "Check the connection and try again. Your text is kept.");
      } finally {
        if (inFlight === controller) {
          inFlight = null;
          setBusy(false);
        }
      }
    }

    form.addEventListener("submit", (event) => {
      event.preventDefault();
      send();
    });

    // Ctrl+Enter (Cmd+Enter on a Mac) submits from the text box.
    document.getElementById(config.fields[0]).addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        form.requestSubmit();
      }
    });
  }

  for (const config of FORMS) enhance(config);

  const fillForm = document.getElementById("fill-form");
  const text = document.getElementById("text");
  if (!fillForm || !text) return;

  // An example fills the box and runs at once (without JavaScript the link only fills the box).
  for (const link of document.querySelectorAll("a.example")) {
    link.addEventListener("click", (event) => {
      event.preventDefault();
      text.value = link.dataset.text;
      fillForm.requestSubmit();
    });
  }

  const insertMask = document.getElementById("insert-mask");
  const maskToken = text.dataset.maskToken;
  if (insertMask && maskToken) {
    insertMask.hidden = false;
    insertMask.addEventListener("click", () => {
      const start = text.selectionStart ?? text.value.length;
      const end = text.selectionEnd ?? start;
      const before = start > 0 && !/\s/.test(text.value[start - 1]) ? " " : "";
      text.setRangeText(before + maskToken, start, end, "end");
      text.focus();
    });
  }
})();
