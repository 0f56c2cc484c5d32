// Image references to bytes (issue 34): data URIs checked and bounded before decoding, http(s)
// URLs fetched under the webhooks' address policy on every redirect hop, bodies capped, fetches
// timed out; every failure a SluiceError 'invalid_request' naming the param.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { LookupAddress } from 'node:dns';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { SluiceError } from '../src/errors.js';
import { loadImageBytes, sniffImageType, type LoadImageOptions } from '../src/vision/image-source.js';

// One test needs the local test server to pass the address policy while a redirect target is still
// judged by it: while `policy.loopbackIsPublic` is set, 127.0.0.1 counts as public and every other
// address keeps its real verdict.
const policy = vi.hoisted(() => ({ loopbackIsPublic: false }));
vi.mock('../src/webhooks/address-policy.js', async (importOriginal) => {
  const real = await importOriginal<typeof import('../src/webhooks/address-policy.js')>();
  return {
    ...real,
    refusedAddressReason: (address: string) =>
      (policy.loopbackIsPublic && address === '127.0.0.1' ? undefined : real.refusedAddressReason(address)),
  };
});

const PARAM = 'input[0].content[1].image_url';

// Smallest headers that pass the magic-number sniff; the loader never decodes pixels.
const JPEG = Buffer.from([0xff, 0xd8, 0xff, 0xe0, 0, 16, 0x4a, 0x46, 0x49, 0x46, 0, 1]);
const PNG = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13, 0x49, 0x48, 0x44, 0x52]);
const WEBP = Buffer.concat([Buffer.from('RIFF'), Buffer.from([26, 0, 0, 0]), Buffer.from('WEBPVP8L'), Buffer.alloc(4)]);
const GIF = Buffer.concat([Buffer.from('GIF89a'), Buffer.from([1, 0, 1, 0, 0, 0, 0])]);

const dataUri = (type: string, bytes: Buffer): string => `data:${type};base64,${bytes.toString('base64')}`;
const opts = (extra: Partial<LoadImageOptions> = {}): LoadImageOptions => ({ param: PARAM, allowPrivateAddresses: false, ...extra });

/** The SluiceError `promise` rejects with (fails the test if it resolves or throws something else). */
async function rejection(promise: Promise<unknown>): Promise<SluiceError> {
  const err = await promise.then(() => undefined, (e: unknown) => e);
  expect(err).toBeInstanceOf(SluiceError);
  return err as SluiceError;
}

async function expectInvalid(promise: Promise<unknown>, message: RegExp): Promise<SluiceError> {
  const err = await rejection(promise);
  expect(err.code).toBe('invalid_request');
  expect(err.param).toBe(PARAM);
  expect(err.message.startsWith(`${PARAM}: `)).toBe(true);
  expect(err.message).toMatch(message);
  return err;
}

describe('sniffImageType', () => {
  it('knows the four formats by their magic numbers', () => {
    expect(sniffImageType(JPEG)).toBe('image/jpeg');
    expect(sniffImageType(PNG)).toBe('image/png');
    expect(sniffImageType(WEBP)).toBe('image/webp');
    expect(sniffImageType(GIF)).toBe('image/gif');
    expect(sniffImageType(Buffer.from('GIF87a'))).toBe('image/gif');
    expect(sniffImageType(Buffer.from('<svg xmlns="http://www.w3.org/2000/svg"/>'))).toBeUndefined();
    expect(sniffImageType(Buffer.from('RIFF\0\0\0\0WAVE'))).toBeUndefined();
    expect(sniffImageType(Buffer.alloc(0))).toBeUndefined();
  });
});

describe('data URIs', () => {
  it.each([
    ['image/jpeg', JPEG, 'image/jpeg'], ['image/jpg', JPEG, 'image/jpeg'], ['IMAGE/PNG', PNG, 'image/png'],
    ['image/webp', WEBP, 'image/webp'], ['image/gif', GIF, 'image/gif'],
  ] as const)('%s is accepted', async (type, bytes, mediaType) => {
    const img = await loadImageBytes(dataUri(type, bytes), opts());
    expect(img.mediaType).toBe(mediaType);
    expect(img.bytes.equals(bytes)).toBe(true);
  });

  it('refuses a declared type the bytes contradict', async () => {
    await expectInvalid(loadImageBytes(dataUri('image/png', JPEG), opts()), /the data URI says image\/png but holds JPEG data/);
    await expectInvalid(loadImageBytes(dataUri('image/gif', WEBP), opts()), /says image\/gif but holds WebP data/);
    await expectInvalid(loadImageBytes(dataUri('image/png', Buffer.from('hello, world')), opts()), /not a JPEG, PNG, WebP or GIF image/);
  });

  it('refuses unsupported and non-image media types', async () => {
    const svg = Buffer.from('<svg xmlns="http://www.w3.org/2000/svg"/>');
    await expectInvalid(loadImageBytes(dataUri('image/svg+xml', svg), opts()), /media type "image\/svg\+xml" is not supported/);
    await expectInvalid(loadImageBytes(dataUri('text/plain', Buffer.from('hi')), opts()), /"text\/plain" is not supported/);
    await expectInvalid(loadImageBytes('data:image/png,%89PNG', opts()), /must be base64-encoded/);
    await expectInvalid(loadImageBytes('data:image/png;base64', opts()), /must have the form/);
  });

  it('refuses bad base64 and bad padding', async () => {
    const b64 = PNG.toString('base64');
    await expectInvalid(loadImageBytes(`data:image/png;base64,${b64.slice(0, 8)}!${b64.slice(9)}`, opts()), /not valid base64/);
    await expectInvalid(loadImageBytes(`data:image/png;base64,${b64.slice(0, 8)} ${b64.slice(8)}`, opts()), /not valid base64/);
    await expectInvalid(loadImageBytes(`data:image/png;base64,${b64.slice(0, 8)}=${b64.slice(8)}`, opts()), /not valid base64/);
    await expectInvalid(loadImageBytes(`data:image/png;base64,${b64.replace(/=+$/, '')}A`, opts()), /not correctly padded/);
    await expectInvalid(loadImageBytes('data:image/png;base64,', opts()), /holds no data/);
  });

  it('refuses an oversized payload from its length, before decoding it', async () => {
    const maxBytes = 1024;
    // An invalid character deep inside: the size check must fire first, without scanning the data.
    const huge = `data:image/png;base64,${PNG.toString('base64')}${'A'.repeat(4096)}!`;
    const spy = vi.spyOn(Buffer, 'from');
    try {
      const err = await expectInvalid(loadImageBytes(huge, opts({ limits: { maxBytes } })), /larger than the 1024-byte limit/);
      expect(err.message.length).toBeLessThan(300);
      expect(spy).not.toHaveBeenCalled();
    } finally {
      spy.mockRestore();
    }
    // Exactly at the limit is fine; one byte over (still within the length bound) is refused after decoding.
    const atLimit = Buffer.concat([PNG, Buffer.alloc(maxBytes - PNG.length)]);
    expect((await loadImageBytes(dataUri('image/png', atLimit), opts({ limits: { maxBytes } }))).bytes.length).toBe(maxBytes);
    await expectInvalid(loadImageBytes(dataUri('image/png', Buffer.concat([atLimit, Buffer.alloc(1)])), opts({ limits: { maxBytes } })),
      /larger than the 1024-byte limit \(1025 bytes\)/);
  });

  it('never echoes a data URI back', async () => {
    const junk = `data:${'x'.repeat(300)};base64,${'Q'.repeat(10_000)}`;
    const err = await expectInvalid(loadImageBytes(junk, opts()), /must have the form/);
    expect(err.message.length).toBeLessThan(300);
    const err2 = await expectInvalid(loadImageBytes(dataUri(`image/${'y'.repeat(200)}`, PNG), opts()), /is not supported/);
    expect(err2.message).not.toContain('y'.repeat(100));
  });
});

describe('URLs', () => {
  let server: http.Server;
  let base: string;
  const png = Buffer.concat([PNG, Buffer.alloc(100, 7)]);

  beforeAll(async () => {
    server = http.createServer((req, res) => {
      const url = new URL(req.url ?? '/', 'http://x');
      const hops = /^\/hops\/(\d+)$/.exec(url.pathname);
      if (url.pathname === '/img.png') {
        res.writeHead(200, { 'content-type': 'image/png', 'content-length': String(png.length) }).end(png);
      } else if (url.pathname === '/octet') {
        res.writeHead(200, { 'content-type': 'application/octet-stream' }).end(png);
      } else if (hops) {
        const n = Number(hops[1]);
        res.writeHead(n === 0 ? 302 : 301, { location: n === 0 ? '/img.png' : `/hops/${n - 1}` }).end();
      } else if (url.pathname === '/to') {
        res.writeHead(307, { location: url.searchParams.get('u') ?? '' }).end();
      } else if (url.pathname === '/forever') {
        res.writeHead(200, { 'content-type': 'image/png' });
        const chunk = Buffer.alloc(64 * 1024, 1);
        res.write(png);
        const pump = (): void => {
          while (res.write(chunk)) { /* fill the socket */ }
          res.once('drain', pump);
        };
        pump();
        res.on('close', () => res.removeAllListeners('drain'));
      } else if (url.pathname === '/declared-huge') {
        res.writeHead(200, { 'content-type': 'image/png', 'content-length': String(1 << 30) });
        res.write(png); // and then nothing
      } else if (url.pathname === '/silent') {
        // Never answers.
      } else if (url.pathname === '/html') {
        res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' }).end('<html>no</html>');
      } else if (url.pathname === '/text-not-image') {
        res.writeHead(200, { 'content-type': 'image/png' }).end('just text');
      } else {
        res.writeHead(404, { 'content-type': 'text/plain' }).end('not found');
      }
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });

  afterAll(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  const allowed = (extra: Partial<LoadImageOptions> = {}): LoadImageOptions => opts({ allowPrivateAddresses: true, ...extra });

  it('refuses a loopback URL by default, and fetches it when private addresses are allowed', async () => {
    await expectInvalid(loadImageBytes(`${base}/img.png`, opts()), /refused: the URL's host 127\.0\.0\.1 is a loopback address/);
    const fakeDns = async (): Promise<LookupAddress[]> => [{ address: '127.0.0.1', family: 4 }];
    const port = (server.address() as AddressInfo).port;
    await expectInvalid(loadImageBytes(`http://images.example:${port}/img.png`, opts({ resolveAll: fakeDns })),
      /refused: the URL's host images\.example resolves to a refused address: 127\.0\.0\.1 is a loopback address/);
    const img = await loadImageBytes(`${base}/img.png`, allowed());
    expect(img).toEqual({ bytes: png, mediaType: 'image/png' });
    expect((await loadImageBytes(`http://images.example:${port}/octet`, allowed({ resolveAll: fakeDns }))).mediaType).toBe('image/png');
  });

  it('follows redirects up to the limit', async () => {
    expect((await loadImageBytes(`${base}/hops/2`, allowed())).bytes).toEqual(png); // 3 redirects
    expect((await loadImageBytes(`${base}/hops/0`, allowed({ limits: { maxRedirects: 1 } }))).bytes).toEqual(png);
    await expectInvalid(loadImageBytes(`${base}/hops/3`, allowed()), /redirected more than 3 times/);
    await expectInvalid(loadImageBytes(`${base}/hops/0`, allowed({ limits: { maxRedirects: 0 } })), /redirected more than 0 times/);
  });

  it('checks every redirect hop by the same policy', async () => {
    policy.loopbackIsPublic = true;
    try {
      const internalDns = async (name: string): Promise<LookupAddress[]> =>
        (name === 'cdn.example' ? [{ address: '10.0.0.1', family: 4 }] : [{ address: '127.0.0.1', family: 4 }]);
      // The first hop now passes the policy...
      expect((await loadImageBytes(`${base}/img.png`, opts())).bytes).toEqual(png);
      // ...but a redirect to a name that resolves to a private address does not,
      await expectInvalid(loadImageBytes(`${base}/to?u=${encodeURIComponent('http://cdn.example/a.png')}`, opts({ resolveAll: internalDns })),
        /refused: the URL's host cdn\.example resolves to a refused address: 10\.0\.0\.1 is a private address/);
      // nor one to a literal link-local address (the cloud metadata endpoint),
      await expectInvalid(loadImageBytes(`${base}/to?u=${encodeURIComponent('http://169.254.169.254/latest')}`, opts()),
        /refused: the URL's host 169\.254\.169\.254 is a link-local address/);
      // nor one to another scheme.
      await expectInvalid(loadImageBytes(`${base}/to?u=${encodeURIComponent('file:///etc/passwd')}`, opts()),
        /redirected to a "file:" URL; only http\(s\) is followed/);
    } finally {
      policy.loopbackIsPublic = false;
    }
  });

  it('aborts a body over the cap, streamed or declared', async () => {
    const started = Date.now();
    await expectInvalid(loadImageBytes(`${base}/forever`, allowed({ limits: { maxBytes: 256 * 1024 } })),
      /larger than the 262144-byte limit/);
    await expectInvalid(loadImageBytes(`${base}/declared-huge`, allowed()), /larger than the 20971520-byte limit \(1073741824 bytes\)/);
    expect(Date.now() - started).toBeLessThan(2000);
  });

  it('times out a server that never answers', async () => {
    const started = Date.now();
    await expectInvalid(loadImageBytes(`${base}/silent`, allowed({ limits: { fetchTimeoutMs: 200 } })), /took longer than 200 ms/);
    expect(Date.now() - started).toBeLessThan(1500);
  });

  it("turns the caller's abort into 'cancelled'", async () => {
    const controller = new AbortController();
    setTimeout(() => controller.abort(new Error('client gone')), 50);
    const err = await rejection(loadImageBytes(`${base}/silent`, allowed({ signal: controller.signal })));
    expect(err.code).toBe('cancelled');
    const err2 = await rejection(loadImageBytes(`${base}/img.png`, allowed({ signal: AbortSignal.abort() })));
    expect(err2.code).toBe('cancelled');
  });

  it('refuses error statuses, non-image content types and non-image bodies', async () => {
    await expectInvalid(loadImageBytes(`${base}/missing.png`, allowed()), /the server answered 404 Not Found/);
    await expectInvalid(loadImageBytes(`${base}/html`, allowed()), /serves "text\/html", not an image/);
    await expectInvalid(loadImageBytes(`${base}/text-not-image`, allowed()), /content is not a JPEG, PNG, WebP or GIF image/);
  });

  it('refuses other schemes and malformed references', async () => {
    await expectInvalid(loadImageBytes('ftp://example.com/a.png', opts()), /only http\(s\) URLs and base64 data URIs are supported \(got a "ftp:" URL\)/);
    await expectInvalid(loadImageBytes('file:///etc/passwd', allowed()), /got a "file:" URL/);
    await expectInvalid(loadImageBytes('javascript:alert(1)', allowed()), /got a "javascript:" URL/);
    await expectInvalid(loadImageBytes('not a url', opts()), /must be an http\(s\) URL or a base64 data URI/);
  });

  it('reports an unreachable host as a fetch failure', async () => {
    const closed = http.createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const port = (closed.address() as AddressInfo).port;
    await new Promise((resolve) => closed.close(resolve));
    await expectInvalid(loadImageBytes(`http://127.0.0.1:${port}/a.png`, allowed()), /could not fetch the image: connect ECONNREFUSED 127\.0\.0\.1/);
  });
});
