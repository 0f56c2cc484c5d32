// Imported first by the command line. Each engine runs its steps on libuv's thread pool: the one
// running and, while it runs, the next (queued in the addon, waiting on a pool thread). With a few
// models that could take the default pool's four threads from file I/O, so the CLI starts with a
// larger pool unless the operator set one (Node sizes the pool at its first use).
process.env.UV_THREADPOOL_SIZE ??= '16';
