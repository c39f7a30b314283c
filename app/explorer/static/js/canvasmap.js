// A large heatmap painted on a <canvas>: one filled rectangle per value, no element per cell, so thousands of
// steps draw in milliseconds. A second canvas on top marks the selected cell; the mouse and the arrow keys
// select a cell and the readout says its value in words.
import { colour } from "./colormap.js";
import { html, shorten } from "./dom.js";

const MAX_HEIGHT = 12000; // px of cells: 14 px rows up to 857 rows, then thinner, 1 px from 6,001 rows (max 10,001)
const FONT = "11px system-ui, sans-serif";

/** The canvas map of `options` (as renderHeatmap's), colours over low..high, in a scrolling box; a selected
 * cell is said in `readout`. */
export function drawCanvasMap(options, [low, high], budget, readout) {
  const { matrix, rowLabels, colLabels } = options;
  const rows = matrix.length;
  const columns = matrix[0].length;
  const labelLength = options.labelLength ?? 14;
  const left = 8 + 6.5 * labelLength;
  const cellWidth = clamp(Math.floor((budget - left - 8) / columns), 12, 40);
  const cellHeight = clamp(Math.floor(MAX_HEIGHT / rows), 1, 14);
  const bottom = 12 + 4.8 * Math.min(labelLength, Math.max(...colLabels.map((label) => label.length), 1));
  const top = 6;
  const width = left + columns * cellWidth + 8;
  const height = top + rows * cellHeight + bottom;
  const geometry = { left, top, cellWidth, cellHeight };

  const canvas = html("canvas", {
    class: "heatmap", width, height, tabindex: 0, role: "img", "aria-describedby": readout.id,
    "aria-label": `${options.title}: ${rows} by ${columns} map. Use the arrow keys to read each value.`,
  }, `${options.title}: the numbers are in the table below.`);
  const overlay = html("canvas", { class: "overlay", width, height, "aria-hidden": "true" });
  const context = canvas.getContext("2d");
  paintCells(context, matrix, geometry, (value) => colour((value - low) / (high - low)));
  paintLabels(context, rowLabels, colLabels, geometry, rows, labelLength);

  const box = html("div", { class: "scroll" }, html("div", { class: "canvas-map" }, [canvas, overlay]));
  let active = null;
  const select = (row, column) => {
    active = [clamp(row, 0, rows - 1), clamp(column, 0, columns - 1)];
    const [r, c] = active;
    markCell(overlay, geometry, r, c);
    readout.textContent = options.describe(r, c, matrix[r][c]);
    keepInView(box, top + r * cellHeight, cellHeight);
  };
  canvas.addEventListener("mousemove", (event) => {
    const cell = cellAt(canvas, geometry, event, rows, columns);
    if (cell) select(...cell);
  });
  canvas.addEventListener("focus", () => select(...(active ?? [0, 0])));
  canvas.addEventListener("keydown", (event) => {
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1],
      PageUp: [-10, 0], PageDown: [10, 0], Home: [-rows, 0], End: [rows, 0] };
    const move = moves[event.key];
    if (!move) return;
    event.preventDefault();
    const [r, c] = active ?? [0, 0];
    select(r + move[0], c + move[1]);
  });
  return box;
}

function paintCells(context, matrix, { left, top, cellWidth, cellHeight }, fill) {
  const gap = cellHeight >= 6 ? 0.5 : 0; // thin rows touch, as a white line would hide them
  matrix.forEach((values, row) => {
    values.forEach((value, column) => {
      context.fillStyle = fill(value);
      context.fillRect(left + column * cellWidth, top + row * cellHeight, cellWidth - 0.5, cellHeight - gap);
    });
  });
}

/** Every row label when rows are 14 px high, else one every 14 px or so; the column labels turned upwards. */
function paintLabels(context, rowLabels, colLabels, { left, top, cellWidth, cellHeight }, rows, labelLength) {
  context.font = FONT;
  context.fillStyle = "#1b1f24";
  context.textAlign = "end";
  const every = Math.ceil(14 / cellHeight);
  for (let row = 0; row < rows; row += every) {
    context.fillText(shorten(rowLabels[row], labelLength), left - 6, top + row * cellHeight + Math.min(cellHeight, 14) / 2 + 4);
  }
  colLabels.forEach((label, column) => {
    const x = left + column * cellWidth + cellWidth / 2 + 4;
    const y = top + rows * cellHeight + 8;
    context.save();
    context.translate(x, y);
    context.rotate(((cellWidth < 18 ? -90 : -50) * Math.PI) / 180);
    context.fillText(shorten(label, labelLength), 0, 0);
    context.restore();
  });
}

function markCell(overlay, { left, top, cellWidth, cellHeight }, row, column) {
  const context = overlay.getContext("2d");
  context.clearRect(0, 0, overlay.width, overlay.height);
  context.strokeStyle = "#e8a400";
  context.lineWidth = 3;
  const height = Math.max(cellHeight, 4);
  context.strokeRect(left + column * cellWidth, top + row * cellHeight - (height - cellHeight) / 2, cellWidth, height);
}

function cellAt(canvas, { left, top, cellWidth, cellHeight }, event, rows, columns) {
  const bounds = canvas.getBoundingClientRect();
  const column = Math.floor((event.clientX - bounds.left - left) / cellWidth);
  const row = Math.floor((event.clientY - bounds.top - top) / cellHeight);
  return row >= 0 && row < rows && column >= 0 && column < columns ? [row, column] : null;
}

/** Scroll `box` so that the band y..y+height of its content is visible. */
function keepInView(box, y, height) {
  if (y < box.scrollTop) box.scrollTop = Math.max(0, y - 20);
  else if (y + height > box.scrollTop + box.clientHeight) box.scrollTop = y + height - box.clientHeight + 20;
}

function clamp(value, low, high) {
  return Math.min(high, Math.max(low, value));
}
