// Parsing a pasted history: a JSON list of {question, correct}, or one "id answer" pair per line.
const ANSWERS = new Map([
  ["1", true], ["true", true], ["right", true], ["correct", true], ["yes", true], ["✓", true],
  ["0", false], ["false", false], ["wrong", false], ["incorrect", false], ["no", false], ["✗", false],
]);

/** [{question, correct}] from pasted text; throws an Error naming the first line it cannot read. */
export function parseHistory(text) {
  const trimmed = text.trim();
  if (!trimmed) throw new Error("The pasted history is empty.");
  if (trimmed.startsWith("[")) {
    let items;
    try {
      items = JSON.parse(trimmed);
    } catch (error) {
      throw new Error(`The pasted JSON does not parse: ${error.message}`);
    }
    return items.map((item, index) => {
      if (!Number.isInteger(item?.question) || typeof item?.correct !== "boolean") {
        throw new Error(`Item ${index + 1} needs an integer "question" and a true/false "correct".`);
      }
      return { question: item.question, correct: item.correct };
    });
  }
  return trimmed.split(/\r?\n/).filter((line) => line.trim()).map((line, index) => {
    const [id, answer, ...rest] = line.trim().split(/[\s,;:]+/);
    const correct = ANSWERS.get((answer ?? "").toLowerCase());
    if (!/^\d+$/.test(id) || correct === undefined || rest.length) {
      throw new Error(`Line ${index + 1} ("${line.trim()}") is not a question id and an answer such as "12 1" or "12 wrong".`);
    }
    return { question: Number(id), correct };
  });
}
