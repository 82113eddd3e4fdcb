// Kenning console: live regions without inline script (the page's CSP forbids it).
// A page marks the part to refresh with data-live-region; the script fetches the page
// again and swaps that part in. The instances list does so every data-refresh seconds
// unless paused (remembered per browser); an instance page does so whenever its
// server-sent event stream (data-live-stream) says the instance changed.
(function () {
  "use strict";
  var region = document.querySelector("[data-live-region]");
  if (!region) { return; }
  var state = document.querySelector("[data-live-state]");
  var busy = false;
  var shown = region.innerHTML;  // what the page last showed, as the parser writes it
  var pending = null;  // fresh content held back while the focus was on something it lacks

  function say(text) { if (state) { state.textContent = text; } }

  // What makes an element the same one after a swap: tag, id, link, name and text.
  function same(el) {
    return [el.tagName, el.id, el.getAttribute("href"), el.getAttribute("name"), el.textContent.trim()].join("\n");
  }
  // How many elements alike to `el` come before it in `root`.
  function rank(el, root) {
    var wanted = same(el), nth = 0, all = root.querySelectorAll(el.tagName);
    for (var i = 0; i < all.length && all[i] !== el; i++) { if (same(all[i]) === wanted) { nth++; } }
    return nth;
  }
  function find(key, root) {
    var nth = key.nth, all = root.querySelectorAll(key.tag);
    for (var i = 0; i < all.length; i++) {
      if (same(all[i]) === key.wanted) { if (nth === 0) { return all[i]; } nth--; }
    }
    return null;
  }

  // Swap the fresh content in, keeping the keyboard focus where it was (a swap under the
  // focus would drop it to the page's start). If the focused element is not in the fresh
  // content, wait until the focus leaves the region.
  function show(html) {
    var focused = document.activeElement, key = null;
    if (focused && focused !== region && region.contains(focused)) {
      key = { tag: focused.tagName, wanted: same(focused), nth: rank(focused, region) };
      var holder = document.createElement("div");
      holder.innerHTML = html;
      if (!find(key, holder)) { pending = html; return; }
    }
    pending = null;
    shown = html;
    // a <details> the reader opened (a traceback, "Why it is where it is") stays open: known
    // by its summary's text and how many summaries of that text come before it
    function summaries() {
      var all = region.querySelectorAll("details > summary"), seen = {}, keyed = [];
      for (var i = 0; i < all.length; i++) {
        var text = all[i].textContent.trim();
        seen[text] = (seen[text] || 0) + 1;
        keyed.push({ key: text + "\n" + seen[text], details: all[i].parentNode });
      }
      return keyed;
    }
    var opened = {}, before = summaries();
    for (var i = 0; i < before.length; i++) { if (before[i].details.open) { opened[before[i].key] = true; } }
    region.innerHTML = html;
    var after = summaries();
    for (var j = 0; j < after.length; j++) { if (opened[after[j].key]) { after[j].details.open = true; } }
    if (key) {
      var again = find(key, region);
      if (again) { again.focus({ preventScroll: true }); }
    }
    say("Updated " + new Date().toLocaleTimeString());
  }
  region.addEventListener("focusout", function (event) {
    if (pending !== null && !region.contains(event.relatedTarget)) { show(pending); }
  });

  var again = false;  // a change reported while a fetch was in flight: fetch once more after it
  function refresh() {
    // the fetch in flight may have read the page before this change: fetch again when it ends,
    // or the last change of a burst (compensating, then cancelled) would never be shown
    if (busy) { again = true; return; }
    busy = true;
    again = false;
    fetch(window.location.href, { headers: { "Accept": "text/html" }, credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.querySelector("[data-live-region]");
        if (window.kenningStreams) { window.kenningStreams.add(doc); }  // streams begun since
        // nothing changed: no swap and nothing announced (a screen reader would say
        // "Updated" every few seconds)
        if (fresh && fresh.innerHTML !== shown) { show(fresh.innerHTML); }
      })
      .catch(function (error) { say("Update failed (" + error.message + "); retrying"); })
      .then(function () { busy = false; if (again) { refresh(); } });
  }

  var toggle = document.querySelector("[data-refresh-toggle]");
  var seconds = parseFloat(region.getAttribute("data-refresh") || "0");
  if (toggle && seconds > 0) {
    var key = "kenning-console-refresh-paused";
    var timer = null;
    function apply(paused) {
      if (timer) { clearInterval(timer); timer = null; }
      if (!paused) { timer = setInterval(refresh, seconds * 1000); }
      toggle.textContent = paused ? "Resume auto-refresh" : "Pause auto-refresh";
      toggle.setAttribute("aria-pressed", paused ? "true" : "false");
      say(paused ? "Auto-refresh paused" : "Auto-refresh every " + seconds + " s");
    }
    var paused = window.localStorage.getItem(key) === "1";
    toggle.hidden = false;
    toggle.addEventListener("click", function () {
      paused = !paused;
      window.localStorage.setItem(key, paused ? "1" : "0");
      apply(paused);
    });
    apply(paused);
  }

  // the stream's URL names the version this page was rendered from (?seen=): a change
  // made before the stream opened is sent at once, and again on each reconnect
  var stream = region.getAttribute("data-live-stream");
  if (stream && window.EventSource) {
    var source = new EventSource(stream);
    source.addEventListener("hello", function () { say("Live: updates as they happen"); });
    source.addEventListener("changed", refresh);
    source.addEventListener("gone", function () { say("This instance was deleted"); source.close(); });
    source.onerror = function () { say("Live updates interrupted; reconnecting"); };
  }
})();

// Durable streams on an instance's page: each [data-stream-url] is followed with an
// EventSource (the stream's entries, then "close"); a reconnect resumes after the last
// entry shown (Last-Event-ID). Streams the instance begins later come with the page's
// live refresh (kenningStreams.add).
(function () {
  "use strict";
  var section = document.querySelector("[data-streams]");
  if (!section || !window.EventSource) { return; }
  var limit = parseInt(section.getAttribute("data-shown-entries") || "200", 10);

  function follow(box) {
    var list = box.querySelector("[data-stream-entries]");
    var state = box.querySelector("[data-stream-state]");
    var count = 0;
    var source = new EventSource(box.getAttribute("data-stream-url"));
    function describe(closed) {
      state.textContent = (closed ? "closed" : "open, live") + ", " + count + (count === 1 ? " entry" : " entries");
    }
    source.addEventListener("entry", function (event) {
      var entry = JSON.parse(event.data);
      var item = document.createElement("li");
      item.value = entry.offset;
      item.setAttribute("data-offset", String(entry.offset));
      var meta = document.createElement("span");
      meta.className = "muted";
      meta.textContent = entry.attempt ? "attempt " + entry.attempt + (entry.step ? " of " + entry.step : "") + " " : "";
      var value = document.createElement("code");
      value.textContent = JSON.stringify(entry.value);
      item.appendChild(meta);
      item.appendChild(value);
      list.appendChild(item);
      while (list.children.length > limit) { list.removeChild(list.firstElementChild); }
      count = entry.offset + 1;
      describe(false);
    });
    source.addEventListener("close", function () { describe(true); source.close(); });
    source.onerror = function () { state.textContent = "reconnecting"; };
    describe(false);
  }

  function add(doc) {
    var fresh = doc.querySelectorAll("[data-streams] [data-stream]");
    for (var i = 0; i < fresh.length; i++) {
      var key = fresh[i].getAttribute("data-stream");
      var known = false, shown = section.querySelectorAll("[data-stream]");
      for (var j = 0; j < shown.length; j++) { if (shown[j].getAttribute("data-stream") === key) { known = true; } }
      if (known) { continue; }
      var box = document.importNode(fresh[i], true);
      section.appendChild(box);
      section.hidden = false;
      follow(box);
    }
  }

  var boxes = section.querySelectorAll("[data-stream]");
  for (var i = 0; i < boxes.length; i++) { follow(boxes[i]); }
  window.kenningStreams = { add: add };
})();
