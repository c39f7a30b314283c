// A heatmap as SVG: one <rect class="cell"> per value, coloured with viridis, the value in each cell's
// tooltip, a readout line driven by the mouse or the arrow keys, a colour legend and the numbers as a table.
// A map of more than SVG_CELLS values (a long history) is painted on a <canvas> instead (canvasmap.js):
// 100,000 SVG cells took 13 s to build and froze the tab.
import { colour, textColour, legendStops } from "./colormap.js";
import { html, svg, fixed, shorten, drawToWidth, lazyDetails } from "./dom.js";
import { drawCanvasMap } from "./canvasmap.js";

const SVG_CELLS = 64 * 64; // a similarity map of two 64-token sentences stays SVG

let figureCount = 0;

/**
 * Draw `matrix` (rows x columns) into `figure`.
 * options: title, rowLabels, colLabels, rowAxis, colAxis, domain [low, high] (default [0, max]),
 * describe(row, column, value) -> sentence, markedRows / markedColumns (Sets of indices shown as marked),
 * square (cells as wide as tall), labelLength (characters of a label before it is cut).
 * Cells shrink to fit the figure's width down to 12 px; below that the map scrolls sideways.
 */
export function renderHeatmap(figure, options) {
  const cells = options.matrix.length * (options.matrix[0]?.length ?? 0);
  if (cells > SVG_CELLS) {
    drawToWidth(figure, (width) => drawLarge(figure, options, width));
  } else {
    drawToWidth(figure, (width) => draw(figure, options, width));
  }
}

function drawLarge(figure, options, budget) {
  const id = `heatmap-${++figureCount}`;
  const readout = html("p", { class: "readout", id: `${id}-readout`, "aria-live": "polite" }, "\u00a0");
  const { matrix } = options;
  const note = html("p", { class: "hint" }, `${matrix.length} rows by ${matrix[0].length}: too many cells to draw `
    + "one by one, so this map is a picture. Hover it, or focus it and use the arrow keys (Page Up/Down: 10 rows, "
    + "Home/End: first/last row) to read a value; the numbers are in the table below.");
  figure.replaceChildren(
    html("figcaption", {}, options.title),
    note,
    drawCanvasMap(options, domainOf(options), budget, readout),
    readout,
    legend(...domainOf(options), `${id}-gradient`, options.legendLabel),
    numbersTable(options),
  );
}

function draw(figure, options, budget) {
  const { matrix, rowLabels, colLabels } = options;
  const rows = matrix.length;
  const columns = rows ? matrix[0].length : 0;
  const [low, high] = domainOf(options);
  const scaled = (value) => (value - low) / (high - low);
  const labelLength = options.labelLength ?? 14;
  const left = 8 + 6.5 * Math.min(labelLength, Math.max(...rowLabels.map((label) => label.length), 1));
  const cellWidth = clamp(Math.floor((budget - left - 8) / Math.max(columns, 1)), 12, 40);
  const cellHeight = options.square ? cellWidth : clamp(Math.floor(420 / Math.max(rows, 1)), 14, 24);
  const bottom = 12 + 4.8 * Math.min(labelLength, Math.max(...colLabels.map((label) => label.length), 1));
  const top = 6;
  const width = left + columns * cellWidth + 8;
  const height = top + rows * cellHeight + bottom;
  const markedRows = options.markedRows ?? new Set();
  const markedColumns = options.markedColumns ?? new Set();
  const id = `heatmap-${++figureCount}`;

  const readout = html("p", { class: "readout", id: `${id}-readout`, "aria-live": "polite" }, "\u00a0");
  const chart = svg("svg", {
    class: "heatmap",
    viewBox: `0 0 ${width} ${height}`,
    width,
    height,
    role: "img",
    tabindex: 0,
    "aria-label": `${options.title}: ${rows} by ${columns} map. Use the arrow keys to read each value.`,
    "aria-describedby": readout.id,
  });
  const cells = svg("g", { class: "cells" });
  matrix.forEach((values, row) => {
    const group = svg("g", { class: "row", "data-row": row });
    values.forEach((value, column) => {
      const x = left + column * cellWidth;
      const y = top + row * cellHeight;
      const sentence = options.describe(row, column, value);
      group.append(
        svg("rect", {
          class: "cell", x, y, width: cellWidth, height: cellHeight,
          fill: colour(scaled(value)), "data-row": row, "data-column": column, "data-value": value,
        }, [svg("title", {}, sentence)]),
      );
      if (cellWidth >= 30 && cellHeight >= 24) {
        group.append(svg("text", {
          class: "cell-value", x: x + cellWidth / 2, y: y + cellHeight / 2 + 4, fill: textColour(scaled(value)),
          "aria-hidden": "true",
        }, fixed(value, 2).replace(/^0\./, ".")));
      }
    });
    cells.append(group);
  });
  chart.append(cells);
  rowLabels.forEach((label, row) => {
    chart.append(svg("text", {
      class: markedRows.has(row) ? "label marked" : "label", x: left - 6, y: top + row * cellHeight + cellHeight / 2 + 4,
      "text-anchor": "end",
    }, labelText(label, labelLength)));
  });
  colLabels.forEach((label, column) => {
    const x = left + column * cellWidth + cellWidth / 2 + 4;
    const y = top + rows * cellHeight + 8;
    chart.append(svg("text", {
      class: markedColumns.has(column) ? "label marked" : "label", x, y, "text-anchor": "end",
      transform: `rotate(${cellWidth < 18 ? -90 : -50} ${x} ${y})`,
    }, labelText(label, labelLength)));
  });
  const focus = svg("rect", { class: "focus", width: cellWidth, height: cellHeight, visibility: "hidden" });
  chart.append(focus);

  let active = null;
  const select = (row, column) => {
    active = [clamp(row, 0, rows - 1), clamp(column, 0, columns - 1)];
    const [r, c] = active;
    focus.setAttribute("x", left + c * cellWidth);
    focus.setAttribute("y", top + r * cellHeight);
    focus.setAttribute("visibility", "visible");
    readout.textContent = options.describe(r, c, matrix[r][c]);
  };
  cells.addEventListener("mouseover", (event) => {
    const cell = event.target.closest("rect.cell");
    if (cell) select(Number(cell.dataset.row), Number(cell.dataset.column));
  });
  chart.addEventListener("focus", () => select(...(active ?? [0, 0])));
  chart.addEventListener("keydown", (event) => {
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1],
      Home: [0, -columns], End: [0, columns] };
    const move = moves[event.key];
    if (!move || !rows) return;
    event.preventDefault();
    const [r, c] = active ?? [0, 0];
    select(r + move[0], c + move[1]);
  });

  figure.replaceChildren(
    html("figcaption", {}, options.title),
    html("div", { class: "scroll" }, chart),
    readout,
    legend(low, high, `${id}-gradient`, options.legendLabel),
    numbersTable(options),
  );
}

function legend(low, high, gradientId, label) {
  const gradient = svg("linearGradient", { id: gradientId },
    legendStops().map(([offset, fill]) => svg("stop", { offset, "stop-color": fill })));
  return html("div", { class: "legend" }, [
    html("span", {}, fixed(low, 2)),
    svg("svg", { viewBox: "0 0 160 12", width: 160, height: 12, "aria-hidden": "true" }, [
      svg("defs", {}, gradient),
      svg("rect", { width: 160, height: 12, fill: `url(#${gradientId})` }),
    ]),
    html("span", {}, fixed(high, 2)),
    html("span", { class: "hint" }, label ?? ""),
  ]);
}

function numbersTable({ title, matrix, rowLabels, colLabels, rowAxis, colAxis }) {
  return lazyDetails(`${title}: the numbers`, () => {
    const head = html("tr", {}, [html("th", { scope: "col" }, `${rowAxis} \\ ${colAxis}`),
      ...colLabels.map((label) => html("th", { scope: "col" }, label))]);
    const body = matrix.map((values, row) => html("tr", {}, [
      html("th", { scope: "row" }, rowLabels[row]),
      ...values.map((value) => html("td", {}, fixed(value, 3))),
    ]));
    return html("div", { class: "scroll" }, html("table", {}, [html("thead", {}, head), html("tbody", {}, body)]));
  });
}

/** A label's text, cut to `length` characters; a cut one keeps the whole label as its tooltip. */
function labelText(label, length) {
  const short = shorten(label, length);
  return short === label ? [label] : [short, svg("title", {}, label)];
}

/** [low, high] of the colour scale: options.domain, else 0 to the largest value. */
function domainOf({ domain, matrix }) {
  return domain ?? [0, largest(matrix)];
}

/** The largest value of `matrix` (at least 1e-9, so that a scale from 0 to it is never empty). */
export function largest(matrix) {
  return matrix.reduce((most, values) => values.reduce((a, b) => Math.max(a, b), most), 1e-9);
}

function clamp(value, low, high) {
  return Math.min(high, Math.max(low, value));
}
