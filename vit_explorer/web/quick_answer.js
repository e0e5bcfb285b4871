// The page's own script (web/quick_answer.py): it answers a patch click, a click on a tile of the layers × heads grid and
// an upload at once, from the server's quick-answer routes, before Gradio's event round trip; what it needs of the server
// (routes, element ids, header and class names, how long to hold an event back) comes in window.vitExplorerQuickAnswer.
((CONFIG) => {
    const ROUTES = CONFIG.routes;  // the pictures a click on which is answered at once: elem_id → route
    const root = () => ((window.gradio_config && window.gradio_config.root) || location.origin).replace(/\/$/, "") + "/";
    const session = () => document.querySelector(`#${CONFIG.sessionKeyId} [data-session]`);
    const sessionKey = () => session() && session().dataset.session;
    const decoded = async (url) => { const probe = new Image(); probe.src = url; await probe.decode(); return url; };
    let latest = 0;  // an answer that comes after a later one's is not shown
    // fetch a quick answer and show its pictures, all at once when each is decoded (no half-new page); then, after the
    // next frame is painted, ``handOn`` gives Gradio what was held back (Gradio's client keeps the page busy a while)
    const answer = async (path, init, handOn, hold) => {
        const asked = ++latest;
        setTimeout(handOn, hold);
        document.body.classList.add(CONFIG.waitingClass);
        try {
            const response = await fetch(root() + path, init);
            if (response.status === 200) {
                const bytes = await response.arrayBuffer();
                let at = 0;
                const urls = response.headers.get(CONFIG.picturesHeader).split(",").filter(Boolean).map((entry) => {
                    const [id, length] = entry.split(":");
                    const png = new Blob([bytes.slice(at, at += Number(length))], {type: "image/png"});
                    return [id, URL.createObjectURL(png)];
                });
                await Promise.all(urls.map(([, url]) => decoded(url)));
                if (asked === latest) {
                    for (const [id, url] of urls) {
                        const target = document.querySelector(`#${id} img`);
                        if (target) target.src = url;
                    }
                }
                // the pictures stay on screen when their URLs go; Gradio's event soon shows the same files
                setTimeout(() => urls.forEach(([, url]) => URL.revokeObjectURL(url)), hold);
            }
        } catch (error) {
            console.debug("vit-explorer: no quick answer; Gradio's event answers", error);
        } finally {
            if (asked === latest) document.body.classList.remove(CONFIG.waitingClass);
            requestAnimationFrame(() => setTimeout(handOn, 0));
        }
    };
    const once = (give) => { let given = false; return () => { if (!given) { given = true; give(); } }; };

    let heldClick = null;  // the quick answer to the last press: {done, click} (the click held back from Gradio)
    const release = (quick) => () => {
        quick.done = true;
        const click = quick.click;
        quick.click = null;
        if (click) click.target.dispatchEvent(new MouseEvent("click", {bubbles: true, cancelable: true, view: window,
            clientX: click.clientX, clientY: click.clientY, screenX: click.screenX, screenY: click.screenY}));
    };
    const clicked = (event) => event.target.closest && event.target.closest(CONFIG.clickable);
    document.addEventListener("click", (event) => {
        if (!event.isTrusted || !heldClick || heldClick.done || !clicked(event)) return;
        event.stopImmediatePropagation();
        heldClick.click = event;
    }, {capture: true});
    document.addEventListener("pointerdown", (event) => {
        const button = clicked(event);
        const img = button && button.querySelector("img");
        const route = button && ROUTES[Object.keys(ROUTES).find((id) => button.closest(`#${id}`))];
        const key = sessionKey();
        if (event.button !== 0 || !img || !img.naturalWidth || !route || !key) return;
        const box = img.getBoundingClientRect();
        const scale = Math.min(box.width / img.naturalWidth, box.height / img.naturalHeight, 1);
        // a click's coordinates are whole pixels (the pointer's fall in between): as Gradio's select event sees them
        const x = Math.round((Math.floor(event.clientX) - box.left - (box.width - img.naturalWidth * scale) / 2) / scale);
        const y = Math.round((Math.floor(event.clientY) - box.top - (box.height - img.naturalHeight * scale) / 2) / scale);
        if (x < 0 || x >= img.naturalWidth || y < 0 || y >= img.naturalHeight) return;
        if (heldClick) release(heldClick)();
        const quick = heldClick = {done: false, click: null};
        answer(`${route}?session=${key}&x=${x}&y=${y}`, {}, once(release(quick)), CONFIG.holdMs.click);
    }, {capture: true});

    const handed = new WeakSet();  // the change events given back to Gradio
    document.addEventListener("change", (event) => {
        const input = event.target;
        const key = sessionKey();
        if (handed.has(event) || !key || session().dataset.uploadsAhead !== "1" || !(input instanceof HTMLInputElement)
            || !input.matches("#upload input[type=file]")
            || !input.files || input.files.length !== 1) return;
        event.stopImmediatePropagation();
        const file = input.files[0];
        const handOn = once(() => {
            const again = new Event("change", {bubbles: true});
            handed.add(again);
            input.dispatchEvent(again);
        });
        const path = `${CONFIG.uploadRoute}?session=${key}&name=${encodeURIComponent(file.name)}`;
        answer(path, {method: "POST", body: file}, handOn, CONFIG.holdMs.upload);
    }, {capture: true});
})(window.vitExplorerQuickAnswer);
