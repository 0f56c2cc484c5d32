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
import { DEFAULT_IMAGE_LIMITS, type ImageBytes, type ImageLimits, type ImageMediaType } from './image-source.js';

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
    // libvips refuses to decode past this many pixels even if the header below lied.
    limitInputPixels: maxPixels,
    pages: 1,
    page: 0,
    autoOrient: true,
    ignoreIcc: true,
    // Corrupt or truncated data is an error, not a best-effort image (PIL raises on truncation too).
    failOn: 'error',
  };
  let width: number;
  let height: number;
  try {
    // The header alone, without the pixel limit, so that an oversized image gets the message below.
    const meta = await sharp(img.bytes, { ...options, limitInputPixels: false }).metadata();
    if (meta.format !== SHARP_FORMAT[img.mediaType]) {
      throw invalid(param, `the image says ${img.mediaType} but its data is ${meta.format ?? 'of an unknown format'}`);
    }
    // With pages: 1, height is the first frame's height.
    width = meta.width;
    height = meta.height;
  } catch (err) {
    if (err instanceof SluiceError) throw err;
    throw invalid(param, `the image could not be decoded (${errorText(err)})`, err);
  }
  if (!(width > 0 && height > 0)) throw invalid(param, 'the image has no pixels');
  if (width * height > maxPixels) {
    throw invalid(param, `the image is ${width} x ${height} = ${width * height} pixels, over the ${maxPixels}-pixel limit`);
  }
  let raw: { data: Buffer; info: { width: number; height: number; channels: number } };
  try {
    raw = await sharp(img.bytes, options)
      .flatten({ background: { r: 255, g: 255, b: 255 } })
      .toColourspace('srgb')
      .raw({ depth: 'uchar' })
      .toBuffer({ resolveWithObject: true });
  } catch (err) {
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

/** The first line of a libvips message, bounded: it can run to several lines of loader detail. */
function errorText(err: unknown): string {
  const text = (err instanceof Error ? err.message : String(err)).split('\n')[0]!.trim();
  return text.length > 200 ? `${text.slice(0, 200)}...` : text;
}
