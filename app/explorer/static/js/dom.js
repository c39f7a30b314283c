// Small helpers to build HTML and SVG elements without innerHTML (text is always set as text).
const SVG_NS = "http://www.w3.org/2000/svg";

function build(element, attributes, children) {
  for (const [name, value] of Object.entries(attributes || {})) {
    if (value !== undefined && value !== null && value !== false) element.setAttribute(name, String(value));
  }
  for (const child of [].concat(children ?? [])) {
    if (child === null || child === undefined) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

/** An HTML element: html("li", {class: "x"}, ["text", otherElement]). */
export function html(tag, attributes, children) {
  return build(document.createElement(tag), attributes, children);
}

/** An SVG element, with the same signature as html(). */
export function svg(tag, attributes, children) {
  return build(document.createElementNS(SVG_NS, tag), attributes, children);
}

/** Show `message` in an alert box, or hide the box when message is empty. */
export function showError(box, message) {
  box.textContent = message || "";
  box.hidden = !message;
}

/** Say `message` in a busy line (and mark `region` aria-busy), or hide the line when message is empty. */
export function showBusy(line, region, message) {
  line.textContent = message || "";
  line.hidden = !message;
  if (message) region.setAttribute("aria-busy", "true");
  else region.removeAttribute("aria-busy");
}

/** A number as a short fixed-point string. */
export function fixed(value, digits = 3) {
  return Number(value).toFixed(digits);
}

/** `text` cut to `length` characters with an ellipsis. */
export function shorten(text, length) {
  return text.length > length ? text.slice(0, length - 1) + "…" : text;
}

const drawings = new WeakMap();
const resizes = new ResizeObserver((entries) => {
  for (const entry of entries) {
    const drawing = drawings.get(entry.target);
    const width = Math.floor(entry.contentRect.width);
    if (drawing && width > 0 && width !== drawing.width) {
      drawing.width = width;
      drawing.draw(width);
    }
  }
});

/** Call draw(width of `container`'s content box) now, and again whenever that width changes. */
export function drawToWidth(container, draw) {
  const style = getComputedStyle(container);
  const width = Math.floor(container.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight));
  drawings.set(container, { width, draw });
  resizes.observe(container);
  draw(width > 0 ? width : 560);
}

/** A closed <details> titled `summary` whose content makeContent() builds the first time it is opened. */
export function lazyDetails(summary, makeContent) {
  const details = html("details", { class: "numbers" }, html("summary", {}, summary));
  details.addEventListener("toggle", () => {
    if (details.open && details.children.length === 1) details.append(makeContent());
  });
  return details;
}
