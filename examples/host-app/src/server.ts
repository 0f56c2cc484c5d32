// A host application: a fastify app of its own, with its own routes, that serves the sluice API
// under /llm/v1 (createSluice). Its fastify is its own dependency; sluice takes fastify as a peer.
//
//   MODEL_DIR   a checkpoint directory to serve (default: the tiny demo model, made under ./models)
//   DATA_DIR    sluice's store and files (default ./data; one process per directory)
//   HOST, PORT  where to listen (default 127.0.0.1:3000; PORT=0 picks a free port)

import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import Fastify from 'fastify';
import { createSluice, makeModel, singleModelCatalog } from 'sluice';

const modelDir = resolve(process.env['MODEL_DIR'] ?? join('models', 'tiny'));
if (!process.env['MODEL_DIR'] && !existsSync(join(modelDir, 'config.json'))) {
  // Random weights: the text is gibberish, the API and its plumbing are real.
  await makeModel({ preset: 'tiny', out: modelDir, seed: 1 });
}

const app = Fastify({ logger: true });

// The host's own routes, typed by the host's fastify.
app.get<{ Querystring: { name?: string } }>('/hello', async (request) => ({ hello: request.query.name ?? 'world' }));

// Store, models, background work and batches; the plugin mounts the API where it is registered.
const sluice = await createSluice({ catalog: singleModelCatalog(modelDir, 'tiny'), dataDir: process.env['DATA_DIR'] ?? 'data' });
await app.register(sluice.plugin, { prefix: '/llm/v1' });
if (sluice.firstKey) app.log.info({ apiKey: sluice.firstKey.key }, 'the first API key, shown once');

// app.close() stops the API's work, then frees the models, the store and the data directory.
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    app.close().then(() => process.exit(0), (err: unknown) => {
      app.log.error({ err }, 'close failed');
      process.exit(1);
    });
  });
}

await app.listen({ host: process.env['HOST'] ?? '127.0.0.1', port: Number(process.env['PORT'] ?? 3000) });
