// Image bytes (image-source.ts) decoded to the RGB pixels a vision preprocessor takes
// (qwen2-vl-preprocess.ts), the way Hugging Face transformers prepares an image: load_image applies
// the EXIF orientation (ImageOps.exif_transpose) and convert_to_rgb composites any alpha over a
// WHITE background (Image.alpha_composite onto an opaque white RGBA) before dropping it; grayscale
// and palette images become RGB. Animated GIF / WebP give their first frame, as PIL's Image.open
// does. Embedded ICC profiles are ignored, as PIL's open + convert('RGB') ignores them: the pixel
// values reach the model as they are stored, as they did in the reference pipeline.
//
// libvips (through sharp) does the decoding. sharp runs each pipeline as a native async worker on
// libuv's threadpool (node_modules/sharp/src/pipeline.cc: "libuv worker"), so a decode never
// blocks the event loop; sharp is imported lazily so that a service that never sees an image never
// loads libvips.
//
// Contract: decodeImage resolves with { width, height, rgb } where rgb is [height, width, 3] uint8,
// row-major, channels R, G, B. Bytes that do not decode, a format other than the declared one, and
// images over maxPixels are SluiceError 'invalid_request' (HTTP 400) naming `param`.

import type { Sharp, SharpOptions } from 'sharp';
import { SluiceError } from '../errors.js';
import { DEFAULT_IMAGE_LIMITS, sniffImageType, type ImageBytes, type ImageLimits, type ImageMediaType } from './image-source.js';

export interface DecodedImage {
  width: number;
  height: number;
  /** [height, width, 3] uint8, row-major, R G B. */
  rgb: Uint8Array;
}

/** sharp's metadata().format for each accepted media type. */
const SHARP_FORMAT: Record<ImageMediaType, string> = {
  'image/jpeg': 'jpeg', 'image/png': 'png', 'image/webp': 'webp', 'image/gif': 'gif',
};

type SharpFactory = (input: Buffer, options: SharpOptions) => Sharp;
let sharpFactory: Promise<SharpFactory> | undefined;

function loadSharp(): Promise<SharpFactory> {
  sharpFactory ??= import('sharp').then((m) => m.default as unknown as SharpFactory);
  return sharpFactory;
}

function invalid(param: string, message: string, cause?: unknown): SluiceError {
  return new SluiceError('invalid_request', `${param}: ${message}`, { param, cause });
}

/**
 * Decodes `img` to RGB (see the file's contract). `param` names the request field in errors.
 */
export async function decodeImage(img: ImageBytes, limits: Partial<ImageLimits> = {}, param = 'image'): Promise<DecodedImage> {
  const maxPixels = limits.maxPixels ?? DEFAULT_IMAGE_LIMITS.maxPixels;
  const sharp = await loadSharp();
  const options: SharpOptions = {
    // libvips refuses, from its header, an image over this many pixels.
    limitInputPixels: maxPixels,
    pages: 1,
    page: 0,
    autoOrient: true,
    ignoreIcc: true,
    // Corrupt or truncated data is an error, not a best-effort image (PIL raises on truncation too).
    failOn: 'error',
  };
  // The format from the data's signature (libvips picks its loader the same way), so that one
  // pipeline, with no separate header read, decodes the image.
  const actual = sniffImageType(img.bytes);
  if (actual === undefined) throw invalid(param, 'the image could not be decoded (its data is not a JPEG, PNG, WebP or GIF image)');
  if (actual !== img.mediaType) throw invalid(param, `the image says ${img.mediaType} but its data is ${SHARP_FORMAT[actual]}`);
  let raw: { data: Buffer; info: { width: number; height: number; channels: number } };
  try {
    raw = await sharp(img.bytes, options)
      .flatten({ background: { r: 255, g: 255, b: 255 } })
      .toColourspace('srgb')
      .raw({ depth: 'uchar' })
      .toBuffer({ resolveWithObject: true });
  } catch (err) {
    // libvips refused the header's size: say what it was (the header alone, without the limit).
    if (/pixel limit/i.test(errorText(err))) await refuseSize(sharp, img, options, maxPixels, param);
    throw invalid(param, `the image could not be decoded (${errorText(err)})`, err);
  }
  const { data, info } = raw;
  // NOTE: flatten removes alpha and toColourspace('srgb') widens gray to 3 bands, so the output is
  // 3 uchar channels; anything else would be a change in sharp's behaviour, i.e. a bug here.
  if (info.channels !== 3 || data.length !== info.width * info.height * 3) {
    throw new Error(`sharp produced ${info.channels} channels of ${data.length} bytes for ${info.width} x ${info.height}`);
  }
  return { width: info.width, height: info.height, rgb: new Uint8Array(data.buffer, data.byteOffset, data.length) };
}

/** Throws the pixel-limit refusal naming the image's size (read from its header). */
async function refuseSize(sharp: SharpFactory, img: ImageBytes, options: SharpOptions, maxPixels: number, param: string): Promise<void> {
  let meta;
  try {
    meta = await sharp(img.bytes, { ...options, limitInputPixels: false }).metadata();
  } catch {
    return;  // the caller reports the decoder's own message
  }
  const { width, height } = meta;
  throw invalid(param, `the image is ${width} x ${height} = ${width * height} pixels, over the ${maxPixels}-pixel limit`);
}

/** The first line of a libvips message, bounded: it can run to several lines of loader detail. */
function errorText(err: unknown): string {
  const text = (err instanceof Error ? err.message : String(err)).split('\n')[0]!.trim();
  return text.length > 200 ? `${text.slice(0, 200)}...` : text;
}
