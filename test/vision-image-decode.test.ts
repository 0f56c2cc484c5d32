// Image bytes to RGB pixels (issue 34) as transformers' load_image + convert_to_rgb prepare them:
// first frame, EXIF orientation applied, alpha composited over white, gray widened to RGB, images
// over the pixel limit and undecodable bytes refused with SluiceError 'invalid_request'.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import sharp from 'sharp';
import { describe, expect, it } from 'vitest';
import { SluiceError } from '../src/errors.js';
import { decodeImage } from '../src/vision/image-decode.js';
import type { ImageBytes, ImageMediaType } from '../src/vision/image-source.js';

const PARAM = 'messages[0].content[1].image_url.url';

/** A width x height image with `channels` interleaved bands from `pixel(x, y)`. */
function raw(width: number, height: number, channels: 1 | 3 | 4, pixel: (x: number, y: number) => number[]): Buffer {
  const data = Buffer.alloc(width * height * channels);
  for (let y = 0; y < height; y++) for (let x = 0; x < width; x++) data.set(pixel(x, y), (y * width + x) * channels);
  return data;
}

const gradient = (x: number, y: number): number[] => [(x * 16) & 255, (y * 16) & 255, (x * 7 + y * 3) & 255];
const img = (bytes: Buffer, mediaType: ImageMediaType): ImageBytes => ({ bytes, mediaType });

async function expectInvalid(promise: Promise<unknown>, message: RegExp): Promise<void> {
  const err = await promise.then(() => undefined, (e: unknown) => e);
  expect(err).toBeInstanceOf(SluiceError);
  expect((err as SluiceError).code).toBe('invalid_request');
  expect((err as SluiceError).param).toBe(PARAM);
  expect((err as SluiceError).message).toMatch(message);
}

describe('decodeImage', () => {
  it('round-trips a lossless PNG exactly, as [height, width, 3] row-major RGB', async () => {
    const pixels = raw(13, 7, 3, gradient);
    const png = await sharp(pixels, { raw: { width: 13, height: 7, channels: 3 } }).png().toBuffer();
    const out = await decodeImage(img(png, 'image/png'), {}, PARAM);
    expect([out.width, out.height]).toEqual([13, 7]);
    expect(out.rgb).toBeInstanceOf(Uint8Array);
    expect(Buffer.from(out.rgb).equals(pixels)).toBe(true);
  });

  it('decodes a lossless WebP exactly and a JPEG closely', async () => {
    const pixels = raw(16, 16, 3, () => [200, 100, 50]);
    const webp = await sharp(pixels, { raw: { width: 16, height: 16, channels: 3 } }).webp({ lossless: true }).toBuffer();
    expect(Buffer.from((await decodeImage(img(webp, 'image/webp'), {}, PARAM)).rgb).equals(pixels)).toBe(true);
    const jpeg = await sharp(pixels, { raw: { width: 16, height: 16, channels: 3 } }).jpeg({ quality: 95 }).toBuffer();
    const out = await decodeImage(img(jpeg, 'image/jpeg'), {}, PARAM);
    expect([out.width, out.height]).toEqual([16, 16]);
    for (let i = 0; i < out.rgb.length; i++) expect(Math.abs(out.rgb[i]! - pixels[i]!)).toBeLessThanOrEqual(3);
  });

  it('composites alpha over white, as convert_to_rgb does', async () => {
    // Pixels: fully transparent red, half-transparent green, opaque blue, 25%-opaque dark gray.
    const rgba = Buffer.from([255, 0, 0, 0, 0, 255, 0, 128, 0, 0, 255, 255, 40, 40, 40, 64]);
    const png = await sharp(rgba, { raw: { width: 2, height: 2, channels: 4 } }).png().toBuffer();
    const out = await decodeImage(img(png, 'image/png'), {}, PARAM);
    expect([...out.rgb.subarray(0, 3)]).toEqual([255, 255, 255]);
    expect([...out.rgb.subarray(6, 9)]).toEqual([0, 0, 255]);
    // Elsewhere: src * a + white * (1 - a), within one level of rounding of Pillow's integer blend.
    const blend = (s: number, a: number): number => Math.round((s * a + 255 * (255 - a)) / 255);
    const expected = [blend(0, 128), blend(255, 128), blend(0, 128), blend(40, 64), blend(40, 64), blend(40, 64)];
    const got = [...out.rgb.subarray(3, 6), ...out.rgb.subarray(9, 12)];
    got.forEach((v, i) => expect(Math.abs(v - expected[i]!)).toBeLessThanOrEqual(1));
  });

  it('widens grayscale (and gray + alpha) to RGB', async () => {
    const gray = Buffer.from([0, 77, 128, 255]);
    const png = await sharp(gray, { raw: { width: 2, height: 2, channels: 1 } }).png().toBuffer();
    const out = await decodeImage(img(png, 'image/png'), {}, PARAM);
    expect([...out.rgb]).toEqual([0, 0, 0, 77, 77, 77, 128, 128, 128, 255, 255, 255]);
    const grayAlpha = await sharp(Buffer.from([0, 0, 0, 255]), { raw: { width: 2, height: 1, channels: 2 } }).toColourspace('b-w').png().toBuffer();
    expect((await sharp(grayAlpha).metadata()).channels).toBe(2);
    expect([...(await decodeImage(img(grayAlpha, 'image/png'), {}, PARAM)).rgb]).toEqual([255, 255, 255, 0, 0, 0]);
  });

  it('applies the EXIF orientation', async () => {
    // 8 wide, 4 high; the left half black, the right half white. Orientation 6: rotate 90 degrees clockwise to view.
    const pixels = raw(8, 4, 3, (x) => (x < 4 ? [0, 0, 0] : [255, 255, 255]));
    const jpeg = await sharp(pixels, { raw: { width: 8, height: 4, channels: 3 } }).jpeg({ quality: 100 }).withMetadata({ orientation: 6 }).toBuffer();
    expect((await sharp(jpeg).metadata()).orientation).toBe(6);
    const out = await decodeImage(img(jpeg, 'image/jpeg'), {}, PARAM);
    expect([out.width, out.height]).toEqual([4, 8]);
    // Rotated clockwise, the stored left half (black) is on top.
    const at = (x: number, y: number): number => out.rgb[(y * out.width + x) * 3]!;
    expect(at(1, 1)).toBeLessThan(30);
    expect(at(1, 6)).toBeGreaterThan(225);
  });

  it('takes the first frame of an animated GIF and WebP', async () => {
    const w = 4;
    const h = 3;
    // Frame 0 red (with a transparent corner), frame 1 blue, stacked vertically as sharp wants them.
    const frames = raw(w, h * 2, 4, (x, y) => (y < h ? (x === 0 && y === 0 ? [0, 0, 0, 0] : [255, 0, 0, 255]) : [0, 0, 255, 255]));
    const input = { raw: { width: w, height: h * 2, channels: 4 as const, pageHeight: h } };
    const gif = await sharp(frames, input).gif({ loop: 0, delay: [100, 100] }).toBuffer();
    const webp = await sharp(frames, input).webp({ lossless: true, loop: 0, delay: [100, 100] }).toBuffer();
    for (const [bytes, type] of [[gif, 'image/gif'], [webp, 'image/webp']] as const) {
      expect((await sharp(bytes).metadata()).pages).toBe(2);
      const out = await decodeImage(img(bytes, type), {}, PARAM);
      expect([out.width, out.height]).toEqual([w, h]);
      expect([...out.rgb.subarray(0, 3)]).toEqual([255, 255, 255]);
      for (let i = 1; i < w * h; i++) expect([...out.rgb.subarray(i * 3, i * 3 + 3)]).toEqual([255, 0, 0]);
    }
  });

  it('decodes off the event loop (sharp runs on the libuv threadpool)', async () => {
    const jpeg = await sharp({ create: { width: 3000, height: 3000, channels: 3, background: '#336699' } }).jpeg().toBuffer();
    let ticks = 0;
    const timer = setInterval(() => ticks++, 1);
    try {
      const out = await decodeImage(img(jpeg, 'image/jpeg'), {}, PARAM);
      expect(out.rgb.length).toBe(3000 * 3000 * 3);
    } finally {
      clearInterval(timer);
    }
    // A decode on the main thread would resolve before any timer could fire.
    expect(ticks).toBeGreaterThanOrEqual(2);
  });

  it('refuses an image over the pixel limit', async () => {
    const png = await sharp({ create: { width: 100, height: 50, channels: 3, background: '#808080' } }).png().toBuffer();
    await expectInvalid(decodeImage(img(png, 'image/png'), { maxPixels: 4999 }, PARAM), /100 x 50 = 5000 pixels, over the 4999-pixel limit/);
    expect((await decodeImage(img(png, 'image/png'), { maxPixels: 5000 }, PARAM)).rgb.length).toBe(5000 * 3);
  });

  it('refuses undecodable bytes and a format other than the declared one', async () => {
    await expectInvalid(decodeImage(img(Buffer.from('this is not an image at all'), 'image/png'), {}, PARAM), /could not be decoded/);
    const png = await sharp({ create: { width: 32, height: 32, channels: 3, background: '#808080' } }).png().toBuffer();
    // The right magic number, the rest cut off.
    await expectInvalid(decodeImage(img(png.subarray(0, 40), 'image/png'), {}, PARAM), /could not be decoded/);
    await expectInvalid(decodeImage(img(png, 'image/jpeg'), {}, PARAM), /says image\/jpeg but its data is png/);
  });

  it('refuses a truncated JPEG rather than decoding part of it', async () => {
    const pixels = raw(64, 64, 3, gradient);
    const jpeg = await sharp(pixels, { raw: { width: 64, height: 64, channels: 3 } }).jpeg().toBuffer();
    await expectInvalid(decodeImage(img(jpeg.subarray(0, Math.floor(jpeg.length * 0.6)), 'image/jpeg'), {}, PARAM), /could not be decoded/);
  });
});

describe("against Pillow's decoding (fixtures from scripts/vision-golden.py)", () => {
  interface Decode { name: string; mediaType: ImageBytes['mediaType']; file: string; width: number; height: number; rgb: string }
  const golden = JSON.parse(readFileSync(join(import.meta.dirname, 'fixtures', 'vision', 'qwen2-vl-golden.json'), 'utf8')) as { decodes: Decode[] };
  it.each(golden.decodes.map((d) => [d.name, d] as const))('%s', async (name, d) => {
    const got = await decodeImage({ bytes: Buffer.from(d.file, 'base64'), mediaType: d.mediaType });
    expect([got.width, got.height]).toEqual([d.width, d.height]);
    const want = Buffer.from(d.rgb, 'base64');
    let worst = 0;
    for (let i = 0; i < want.length; i++) worst = Math.max(worst, Math.abs(got.rgb[i]! - want[i]!));
    // JPEG: sharp's libjpeg (mozjpeg) and Pillow's libjpeg-turbo decode the same bytes. Alpha over
    // white: sharp blends in floating point, Pillow in fixed point, one level apart at most.
    expect(worst, `${name}: largest difference from Pillow`).toBeLessThanOrEqual(name === 'png-rgba' ? 1 : 0);
  });
});
