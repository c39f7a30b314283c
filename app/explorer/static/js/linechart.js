// A line chart of one probability per step as SVG: a <circle class="point"> per step (filled when the answer
// was right, hollow when wrong), a tooltip per point, a readout driven by the mouse or the arrow keys, and a table.
// A second model's values on the same steps can be drawn over it: a dashed line with a <rect class="compare-point">
// per step.
import { html, svg, fixed, drawToWidth, lazyDetails } from "./dom.js";

/**
 * Draw `values` (0..1, one per step) into `figure`; describe(step) says what a point means in one sentence.
 * The axis numbers the steps from firstStep (default 1). With `compare` ({name, values}), that model's values are
 * drawn too and the legend names both lines (`name` is the first one's model).
 */
export function renderLineChart(figure, options) {
  drawToWidth(figure, (width) => draw(figure, options, width));
}

function draw(figure, { title, name, values, compare, firstStep = 1, correct, describe, tableHeads, tableRow }, width) {
  const count = values.length;
  const height = width < 500 ? 200 : 240;
  const [left, right, top, bottom] = [44, 16, 12, 34];
  const x = (step) => left + (count === 1 ? 0.5 : step / (count - 1)) * (width - left - right);
  const y = (value) => top + (1 - value) * (height - top - bottom);
  const readout = html("p", { class: "readout", id: "line-readout", "aria-live": "polite" }, "\u00a0");
  const chart = svg("svg", {
    class: "linechart", viewBox: `0 0 ${width} ${height}`, width, height, role: "img", tabindex: 0,
    "aria-label": `${title}: ${count} steps. Use the arrow keys to read each step.`, "aria-describedby": readout.id,
  });
  for (const tick of [0, 0.25, 0.5, 0.75, 1]) {
    chart.append(
      svg("line", { class: tick === 0.5 ? "grid half" : "grid", x1: left, x2: width - right, y1: y(tick), y2: y(tick) }),
      svg("text", { class: "label", x: left - 6, y: y(tick) + 4, "text-anchor": "end" }, fixed(tick, 2)),
    );
  }
  const every = Math.max(1, Math.ceil(count / Math.floor(width / 60)));
  for (let step = 0; step < count; step += every) {
    chart.append(svg("text", { class: "label", x: x(step), y: height - bottom + 16, "text-anchor": "middle" }, firstStep + step));
  }
  chart.append(svg("text", { class: "label axis", x: width - right, y: height - 4, "text-anchor": "end" }, "step"));
  chart.append(svg("polyline", { class: "line", points: values.map((value, step) => `${x(step)},${y(value)}`).join(" ") }));
  const points = svg("g", {});
  values.forEach((value, step) => {
    points.append(svg("circle", {
      class: correct[step] ? "point right" : "point wrong", cx: x(step), cy: y(value), r: count > 60 ? 2.5 : 5,
      "data-step": step, "data-value": value,
    }, svg("title", {}, describe(step))));
  });
  chart.append(points);
  if (compare) drawCompared(chart, compare.values, x, y, describe);
  const focus = svg("circle", { class: "focus", r: 9, visibility: "hidden" });
  chart.append(focus);

  let active = null;
  const select = (step) => {
    active = Math.min(count - 1, Math.max(0, step));
    focus.setAttribute("cx", x(active));
    focus.setAttribute("cy", y(values[active]));
    focus.setAttribute("visibility", "visible");
    readout.textContent = describe(active);
  };
  points.addEventListener("mouseover", (event) => {
    const point = event.target.closest("circle.point");
    if (point) select(Number(point.dataset.step));
  });
  chart.addEventListener("focus", () => select(active ?? 0));
  chart.addEventListener("keydown", (event) => {
    const moves = { ArrowLeft: -1, ArrowRight: 1, Home: -count, End: count };
    if (!(event.key in moves)) return;
    event.preventDefault();
    select((active ?? 0) + moves[event.key]);
  });

  figure.replaceChildren(
    html("figcaption", {}, title),
    html("div", { class: "scroll" }, chart),
    readout,
    html("p", { class: "legend" }, [
      html("span", { class: "swatch right", "aria-hidden": "true" }), "answered right",
      html("span", { class: "swatch wrong", "aria-hidden": "true" }), "answered wrong",
      ...(compare ? [
        html("span", { class: "line-swatch", "aria-hidden": "true" }), name,
        html("span", { class: "line-swatch compare", "aria-hidden": "true" }), compare.name,
      ] : []),
    ]),
    lazyDetails(`${title}: the numbers`, () => html("div", { class: "scroll" }, html("table", {}, [
      html("thead", {}, html("tr", {}, tableHeads.map((head) => html("th", { scope: "col" }, head)))),
      html("tbody", {}, values.map((_, step) => html("tr", {}, tableRow(step).map((cell, column) =>
        html(column ? "td" : "th", column ? { class: Number.isNaN(Number(cell)) ? "text" : null } : { scope: "row" }, cell))))),
    ]))),
  );
}

/** The second model's line (dashed) and a square per step, each with the step's sentence as its tooltip. */
function drawCompared(chart, values, x, y, describe) {
  chart.append(svg("polyline", { class: "line compare", points: values.map((value, step) => `${x(step)},${y(value)}`).join(" ") }));
  const side = values.length > 60 ? 5 : 8;
  chart.append(svg("g", {}, values.map((value, step) => svg("rect", {
    class: "compare-point", x: x(step) - side / 2, y: y(value) - side / 2, width: side, height: side,
    "data-step": step, "data-value": value,
  }, svg("title", {}, describe(step))))));
}
