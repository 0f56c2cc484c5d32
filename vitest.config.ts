import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    testTimeout: 120_000,
    hookTimeout: 300_000,
    // Engine tests are CPU heavy; running files one after another keeps timings sane on 2 cores.
    fileParallelism: false,
  },
});
