// Viridis (van der Walt & Smith, matplotlib): perceptually uniform and readable with the common colour-vision
// deficiencies. 17 evenly spaced samples of matplotlib's table, interpolated linearly between neighbours.
const VIRIDIS = [
  "#440154", "#48186a", "#472d7b", "#424086", "#3b528b", "#33638d", "#2c728e", "#26828e", "#21918c",
  "#1fa088", "#28ae80", "#3fbc73", "#5ec962", "#84d44b", "#addc30", "#d8e219", "#fde725",
].map((hex) => [1, 3, 5].map((start) => parseInt(hex.slice(start, start + 2), 16)));

/** The viridis colour of `fraction` (clamped to 0..1) as "rgb(r, g, b)". */
export function colour(fraction) {
  const position = Math.min(1, Math.max(0, Number.isFinite(fraction) ? fraction : 0)) * (VIRIDIS.length - 1);
  const index = Math.min(VIRIDIS.length - 2, Math.floor(position));
  const weight = position - index;
  const [r, g, b] = VIRIDIS[index].map((channel, i) => Math.round(channel + (VIRIDIS[index + 1][i] - channel) * weight));
  return `rgb(${r}, ${g}, ${b})`;
}

/** Black or white, whichever reads better on colour(fraction). */
export function textColour(fraction) {
  return fraction > 0.55 ? "#000" : "#fff";
}

/** [offset, colour] pairs for an SVG gradient of the whole map. */
export function legendStops() {
  return VIRIDIS.map((_, i) => [i / (VIRIDIS.length - 1), colour(i / (VIRIDIS.length - 1))]);
}
