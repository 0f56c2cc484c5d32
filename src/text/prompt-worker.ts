// A prompt worker (worker_threads): renders and tokenizes long prompts off the event loop. It
// loads a model's tokenizer on its first job for that model and keeps it. Jobs arrive as
// {id, modelDir, text}; the answer is {id, tokenIds} (a transferred Int32Array) or {id, error}.
// Started by PromptPool (prompt-pool.ts) from the compiled file dist/src/text/prompt-worker.js.

import { parentPort } from 'node:worker_threads';
import { isSluiceError } from '../errors.js';
import { PromptEncoder, type PromptText } from './prompt-encoder.js';
import { readJsonFile, SluiceTokenizer } from './tokenizer.js';
import { imageTextExpansion } from './image-prompt.js';

export interface PromptJob {
  id: number;
  modelDir: string;
  text: PromptText;
}

export type PromptAnswer =
  | { id: number; tokenIds: Int32Array }
  | { id: number; error: { code: string; message: string; param?: string } };

const encoders = new Map<string, Promise<PromptEncoder>>();

function encoderFor(modelDir: string): Promise<PromptEncoder> {
  let encoder = encoders.get(modelDir);
  if (!encoder) {
    encoder = (async () => {
      const tokenizer = await SluiceTokenizer.load(modelDir);
      const config = (await readJsonFile(modelDir, 'config.json', { required: false })) ?? {};
      return new PromptEncoder(tokenizer, modelDir, imageTextExpansion(config, tokenizer));
    })();
    encoders.set(modelDir, encoder);
    encoder.catch(() => encoders.delete(modelDir));
  }
  return encoder;
}

parentPort?.on('message', (job: PromptJob) => {
  void (async () => {
    let answer: PromptAnswer;
    try {
      const tokenIds = Int32Array.from((await encoderFor(job.modelDir)).encode(job.text));
      answer = { id: job.id, tokenIds };
      parentPort!.postMessage(answer, [tokenIds.buffer]);
      return;
    } catch (err) {
      const code = isSluiceError(err) ? err.code : 'engine_error';
      const param = isSluiceError(err) ? err.param : undefined;
      answer = { id: job.id, error: { code, message: (err as Error).message, ...(param !== undefined && { param }) } };
    }
    parentPort!.postMessage(answer);
  })();
});
