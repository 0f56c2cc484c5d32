// Progress of long byte-counted work (writing or reading model weights), for a person watching a
// terminal or reading a log. The callers decide where lines go; this decides when a new line is
// worth showing and what it says.

export function formatBytes(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}

/** `label 40% (1.2 GiB / 3.0 GiB)`. */
export function progressLine(label: string, doneBytes: number, totalBytes: number): string {
  return `${label} ${percentOf(doneBytes, totalBytes)}% (${formatBytes(doneBytes)} / ${formatBytes(totalBytes)})`;
}

function percentOf(done: number, total: number): number {
  return total <= 0 ? 100 : Math.min(100, Math.floor((done / total) * 100));
}

/**
 * Returns a progress callback that calls `show(line, finished)` each time the percentage reaches a
 * new multiple of `everyPercent` (1 on a terminal that redraws one line, 10 in a log), 0% and 100%
 * included, each at most once.
 */
export function percentSteps(label: string, everyPercent: number, show: (line: string, finished: boolean) => void):
  (doneBytes: number, totalBytes: number) => void {
  let lastStep = -1;
  return (done, total) => {
    const percent = percentOf(done, total);
    const step = Math.floor(percent / everyPercent);
    if (step <= lastStep) return;
    lastStep = step;
    show(progressLine(label, done, total), percent === 100);
  };
}

/**
 * A progress printer on stderr for the CLI: on a terminal one line redrawn at each percent and
 * ended at 100%; elsewhere (logs, pipes) a line per 10%.
 */
export function stderrProgress(label: string): (doneBytes: number, totalBytes: number) => void {
  const stream = process.stderr;
  if (stream.isTTY === true) {
    return percentSteps(label, 1, (line, finished) => stream.write(`\r${line}${finished ? '\n' : ''}`));
  }
  return percentSteps(label, 10, (line) => stream.write(`${line}\n`));
}
