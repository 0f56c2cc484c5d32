// deploy/kubernetes.yaml, checked offline (CI does not apply it): every document against a JSON
// schema of the fields that matter for its kind (Kubernetes' own field names and types; unknown
// fields refused where a typo would be silently ignored by the API server), then what no
// per-document schema sees: the names that must agree between documents (selector and labels,
// named ports, volumes and the ConfigMap and claims they name), the serve arguments (flags
// `sluice serve` knows, paths under the mounts, the port, the drain within the grace period and
// longer than the readiness probe needs to notice it), what several replicas need (each its own
// data directory, the files on a ReadWriteMany claim, the database URL from a Secret,
// prefix-hash.key and reasoning-keys.json from one Secret in every data directory, the Secrets'
// kubectl lines in the header, a lease length), and the catalog in the ConfigMap, which must be one
// `sluice serve --config` accepts.
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Ajv } from 'ajv';
import { parseAllDocuments } from 'yaml';
import { describe, expect, it } from 'vitest';
import { MAX_DRAIN_SECONDS } from '../src/cli/serve.js';
import { parseCatalog } from '../src/config/catalog.js';
import { CLI } from './helpers/serve-process.js';

const run = promisify(execFile);
const MANIFEST = join(import.meta.dirname, '..', 'deploy', 'kubernetes.yaml');

const name = { type: 'string', pattern: '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$', maxLength: 63 };
const labels = { type: 'object', additionalProperties: { type: 'string' }, minProperties: 1 };
const metadata = {
  type: 'object', required: ['name', 'labels'], additionalProperties: false,
  properties: { name, labels, namespace: name, annotations: { type: 'object', additionalProperties: { type: 'string' } } },
};
const quantity = { anyOf: [{ type: 'integer', minimum: 0 }, { type: 'string', pattern: '^[0-9]+(\\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$' }] };
const resourceList = { type: 'object', additionalProperties: quantity };
const probe = {
  type: 'object', required: ['httpGet'], additionalProperties: false,
  properties: {
    httpGet: {
      type: 'object', required: ['path', 'port'], additionalProperties: false,
      properties: { path: { type: 'string', pattern: '^/' }, port: { anyOf: [name, { type: 'integer' }] }, scheme: { enum: ['HTTP', 'HTTPS'] } },
    },
    initialDelaySeconds: { type: 'integer', minimum: 0 },
    periodSeconds: { type: 'integer', minimum: 1 },
    timeoutSeconds: { type: 'integer', minimum: 1 },
    successThreshold: { type: 'integer', minimum: 1 },
    failureThreshold: { type: 'integer', minimum: 1 },
  },
};
const container = {
  type: 'object', required: ['name', 'image', 'command', 'args', 'ports', 'readinessProbe', 'livenessProbe', 'resources'], additionalProperties: false,
  properties: {
    name, image: { type: 'string', pattern: '^[^\\s]+:[^\\s:]+$' },
    command: { type: 'array', items: { type: 'string' }, minItems: 1 },
    args: { type: 'array', items: { type: 'string' } },
    ports: {
      type: 'array', minItems: 1,
      items: {
        type: 'object', required: ['name', 'containerPort'], additionalProperties: false,
        properties: { name: { ...name, maxLength: 15 }, containerPort: { type: 'integer', minimum: 1, maximum: 65535 }, protocol: { enum: ['TCP', 'UDP', 'SCTP'] } },
      },
    },
    readinessProbe: probe, livenessProbe: probe, startupProbe: probe,
    resources: {
      type: 'object', required: ['requests', 'limits'], additionalProperties: false,
      properties: { requests: resourceList, limits: resourceList },
    },
    env: {
      type: 'array',
      items: {
        type: 'object', required: ['name'], additionalProperties: false, minProperties: 2, maxProperties: 2,
        properties: {
          name: { type: 'string', pattern: '^[A-Za-z_][A-Za-z0-9_]*$' }, value: { type: 'string' },
          valueFrom: {
            type: 'object', required: ['secretKeyRef'], additionalProperties: false,
            properties: { secretKeyRef: { type: 'object', required: ['name', 'key'], additionalProperties: false, properties: { name, key: { type: 'string', minLength: 1 } } } },
          },
        },
      },
    },
    volumeMounts: {
      type: 'array',
      items: {
        type: 'object', required: ['name', 'mountPath'], additionalProperties: false,
        properties: { name, mountPath: { type: 'string', pattern: '^/' }, readOnly: { type: 'boolean' }, subPath: { type: 'string' } },
      },
    },
  },
};
const volume = {
  type: 'object', required: ['name'], additionalProperties: false, minProperties: 2, maxProperties: 2,
  properties: {
    name,
    configMap: { type: 'object', required: ['name'], properties: { name } },
    persistentVolumeClaim: { type: 'object', required: ['claimName'], additionalProperties: false, properties: { claimName: name, readOnly: { type: 'boolean' } } },
    secret: {
      type: 'object', required: ['secretName'], additionalProperties: false,
      properties: {
        secretName: name, defaultMode: { type: 'integer', minimum: 0, maximum: 511 },
        items: {
          type: 'array', minItems: 1,
          items: { type: 'object', required: ['key', 'path'], additionalProperties: false, properties: { key: { type: 'string' }, path: { type: 'string', pattern: '^[^/]' } } },
        },
      },
    },
    emptyDir: { type: 'object' },
  },
};
const kinds: Record<string, object> = {
  ConfigMap: {
    type: 'object', required: ['apiVersion', 'kind', 'metadata', 'data'], additionalProperties: false,
    properties: { apiVersion: { const: 'v1' }, kind: { const: 'ConfigMap' }, metadata, data: { type: 'object', additionalProperties: { type: 'string' }, minProperties: 1 } },
  },
  PersistentVolumeClaim: {
    type: 'object', required: ['apiVersion', 'kind', 'metadata', 'spec'], additionalProperties: false,
    properties: {
      apiVersion: { const: 'v1' }, kind: { const: 'PersistentVolumeClaim' }, metadata,
      spec: {
        type: 'object', required: ['accessModes', 'resources'], additionalProperties: false,
        properties: {
          accessModes: { type: 'array', minItems: 1, items: { enum: ['ReadWriteOnce', 'ReadOnlyMany', 'ReadWriteMany', 'ReadWriteOncePod'] } },
          resources: { type: 'object', required: ['requests'], properties: { requests: { type: 'object', required: ['storage'], properties: { storage: quantity } } } },
          storageClassName: { type: 'string' },
        },
      },
    },
  },
  Deployment: {
    type: 'object', required: ['apiVersion', 'kind', 'metadata', 'spec'], additionalProperties: false,
    properties: {
      apiVersion: { const: 'apps/v1' }, kind: { const: 'Deployment' }, metadata,
      spec: {
        type: 'object', required: ['replicas', 'selector', 'template'], additionalProperties: false,
        properties: {
          replicas: { type: 'integer', minimum: 1 },
          strategy: { type: 'object', properties: { type: { enum: ['Recreate', 'RollingUpdate'] } } },
          selector: { type: 'object', required: ['matchLabels'], additionalProperties: false, properties: { matchLabels: labels } },
          template: {
            type: 'object', required: ['metadata', 'spec'], additionalProperties: false,
            properties: {
              metadata: { type: 'object', required: ['labels'], properties: { labels } },
              spec: {
                type: 'object', required: ['containers', 'terminationGracePeriodSeconds'], additionalProperties: false,
                properties: {
                  terminationGracePeriodSeconds: { type: 'integer', minimum: 1 },
                  containers: { type: 'array', minItems: 1, items: container },
                  volumes: { type: 'array', items: volume },
                  nodeSelector: { type: 'object', additionalProperties: { type: 'string' } },
                  tolerations: { type: 'array' },
                },
              },
            },
          },
        },
      },
    },
  },
  Service: {
    type: 'object', required: ['apiVersion', 'kind', 'metadata', 'spec'], additionalProperties: false,
    properties: {
      apiVersion: { const: 'v1' }, kind: { const: 'Service' }, metadata,
      spec: {
        type: 'object', required: ['selector', 'ports'], additionalProperties: false,
        properties: {
          type: { enum: ['ClusterIP', 'NodePort', 'LoadBalancer'] },
          clusterIP: { type: 'string' },
          selector: labels,
          ports: {
            type: 'array', minItems: 1,
            items: {
              type: 'object', required: ['port', 'targetPort'], additionalProperties: false,
              properties: { name, port: { type: 'integer', minimum: 1, maximum: 65535 }, targetPort: { anyOf: [name, { type: 'integer' }] }, protocol: { enum: ['TCP', 'UDP', 'SCTP'] } },
            },
          },
        },
      },
    },
  },
};

/* eslint-disable @typescript-eslint/no-explicit-any */
type Doc = Record<string, any>;

function load(): Doc[] {
  const docs = parseAllDocuments(readFileSync(MANIFEST, 'utf8'));
  if (!Array.isArray(docs)) throw new Error('no YAML documents');
  for (const d of docs) if (d.errors.length > 0) throw new Error(`YAML: ${d.errors[0]!.message}`);
  return docs.map((d) => d.toJS() as Doc);
}

/** The value after `flag` in args (the flags sluice serve takes, `--flag value`). */
function flag(args: string[], f: string): string | undefined {
  const i = args.indexOf(f);
  return i >= 0 ? args[i + 1] : undefined;
}

describe('deploy/kubernetes.yaml', () => {
  const docs = load();
  const one = (kind: string, n?: string) => {
    const found = docs.filter((d) => d['kind'] === kind && (n === undefined || d['metadata']?.name === n));
    expect(found, `${kind}${n ? ` ${n}` : ''}`).toHaveLength(1);
    return found[0]!;
  };

  it('has a ConfigMap, a Deployment, a Service (and the claims it mounts), each valid for its kind', () => {
    expect(docs.map((d) => d['kind']).sort()).toEqual(['ConfigMap', 'Deployment', 'PersistentVolumeClaim', 'PersistentVolumeClaim', 'Service']);
    const ajv = new Ajv({ allErrors: true, strict: true });
    for (const d of docs) {
      const validate = ajv.compile(kinds[String(d['kind'])]!);
      expect(validate(d) ? [] : validate.errors!.map((e) => `${d['kind']} ${e.instancePath} ${e.message}`), `${d['kind']} ${d['metadata']?.name}`).toEqual([]);
    }
    // The schema refuses what it should: a misspelt field, a wrong apiVersion.
    const deployment = one('Deployment');
    const validate = ajv.compile(kinds['Deployment']!);
    expect(validate({ ...deployment, apiVersion: 'v1' })).toBe(false);
    const typo = structuredClone(deployment);
    typo['spec'].template.spec.containers[0].readinesProbe = typo['spec'].template.spec.containers[0].readinessProbe;
    expect(validate(typo)).toBe(false);
  });

  it('agrees with itself: labels, ports, probes, volumes, GPU and the drain', () => {
    const deployment = one('Deployment');
    const service = one('Service');
    const configMap = one('ConfigMap');
    const pod = deployment['spec'].template;
    const [c] = pod.spec.containers as Doc[];
    // The Deployment selects its own pods; the Service selects the same pods.
    for (const [k, v] of Object.entries(deployment['spec'].selector.matchLabels)) expect(pod.metadata.labels[k]).toBe(v);
    for (const [k, v] of Object.entries(service['spec'].selector)) expect(pod.metadata.labels[k]).toBe(v);
    // Named ports exist on the container; the probes are /ready (readiness) and /health (liveness).
    const portNames = new Set((c!['ports'] as Doc[]).map((p) => p['name']));
    for (const p of service['spec'].ports as Doc[]) expect(portNames.has(p['targetPort']), `Service targetPort ${p['targetPort']}`).toBe(true);
    expect(c!['readinessProbe'].httpGet.path).toBe('/ready');
    expect(c!['livenessProbe'].httpGet.path).toBe('/health');
    for (const pr of ['readinessProbe', 'livenessProbe', 'startupProbe']) if (c![pr]) expect(portNames.has(c![pr].httpGet.port), `${pr} port`).toBe(true);
    // One GPU, requested and limited alike (Kubernetes requires extended resources in limits, equal to requests).
    expect(c!['resources'].limits['nvidia.com/gpu']).toBe(1);
    expect(c!['resources'].requests['nvidia.com/gpu']).toBe(1);
    // Every mount names a volume; the volumes name this ConfigMap and these claims.
    const volumes = new Map((pod.spec.volumes as Doc[]).map((v) => [v['name'], v]));
    for (const m of c!['volumeMounts'] as Doc[]) expect(volumes.has(m['name']), `volume ${m['name']}`).toBe(true);
    const claims = new Set(docs.filter((d) => d['kind'] === 'PersistentVolumeClaim').map((d) => d['metadata'].name));
    for (const v of volumes.values()) {
      if (v['configMap']) expect(v['configMap'].name).toBe(configMap['metadata'].name);
      if (v['persistentVolumeClaim']) expect(claims.has(v['persistentVolumeClaim'].claimName), `claim ${v['persistentVolumeClaim'].claimName}`).toBe(true);
    }
    const mountOf = (volumeName: string) => (c!['volumeMounts'] as Doc[]).find((m) => m['name'] === volumeName)!['mountPath'] as string;
    const catalogVolume = [...volumes.values()].find((v) => v['configMap'])!['name'];

    // The serve arguments: the catalog file is the ConfigMap's key under its mount, the data
    // directory is on a claim, the port is the container port, and the drain fits.
    const args = c!['args'] as string[];
    expect(c!['command']).toEqual(['sluice']);
    expect(args[0]).toBe('serve');
    const config = flag(args, '--config')!;
    expect(Object.keys(configMap['data']).map((k) => `${mountOf(catalogVolume)}/${k}`)).toContain(config);
    const dataDir = flag(args, '--data-dir')!;
    const dataVolume = (c!['volumeMounts'] as Doc[]).find((m) => m['mountPath'] === dataDir);
    expect(dataVolume, `a volume mounted at --data-dir ${dataDir}`).toBeDefined();
    expect(dataVolume!['readOnly']).not.toBe(true);
    expect(Number(flag(args, '--port'))).toBe((c!['ports'] as Doc[]).find((p) => p['name'] === c!['readinessProbe'].httpGet.port)!['containerPort']);
    expect(flag(args, '--host')).toBe('0.0.0.0');
    const drain = Number(flag(args, '--drain-seconds'));
    expect(Number.isInteger(drain) && drain >= 1 && drain <= MAX_DRAIN_SECONDS, `--drain-seconds ${drain}`).toBe(true);
    const ready = c!['readinessProbe'];
    // The probe sees /ready 503 within the drain (and Kubernetes then removes the endpoint) ...
    expect(drain).toBeGreaterThan((ready.periodSeconds ?? 10) * (ready.failureThreshold ?? 3) + (ready.timeoutSeconds ?? 1));
    // ... and the grace period leaves time after the drain for requests in flight to finish.
    expect(pod.spec.terminationGracePeriodSeconds).toBeGreaterThanOrEqual(drain + 60);
  });

  it('runs several replicas on one database, one files volume and one pair of deployment secrets', () => {
    const deployment = one('Deployment');
    const pod = deployment['spec'].template;
    const [c] = pod.spec.containers as Doc[];
    const args = c!['args'] as string[];
    const mounts = c!['volumeMounts'] as Doc[];
    const volumes = new Map((pod.spec.volumes as Doc[]).map((v) => [v['name'], v]));
    const header = readFileSync(MANIFEST, 'utf8').split('\n').filter((l) => l.startsWith('#')).join('\n');
    expect(deployment['spec'].replicas).toBeGreaterThan(1);
    // A pod may be replaced without a spare GPU: no surge.
    expect(deployment['spec'].strategy).toMatchObject({ type: 'RollingUpdate', rollingUpdate: { maxSurge: 0 } });

    // Each replica its own data directory (a shared one would refuse all replicas but the first).
    const dataDir = flag(args, '--data-dir')!;
    expect(volumes.get(mounts.find((m) => m['mountPath'] === dataDir)!['name'])!['emptyDir'], `--data-dir ${dataDir} per pod`).toBeDefined();
    // The files on one ReadWriteMany claim, writable.
    const filesDir = flag(args, '--files-dir');
    expect(filesDir, '--files-dir').toBeDefined();
    const filesMount = mounts.find((m) => m['mountPath'] === filesDir)!;
    expect(filesMount['readOnly']).not.toBe(true);
    const claim = volumes.get(filesMount['name'])!['persistentVolumeClaim'].claimName;
    expect(one('PersistentVolumeClaim', claim)['spec'].accessModes).toContain('ReadWriteMany');

    // The database URL from a Secret, as SLUICE_DATABASE_URL (never on the command line).
    expect(args).not.toContain('--database-url');
    const env = (c!['env'] as Doc[]).find((e) => e['name'] === 'SLUICE_DATABASE_URL');
    expect(env?.['valueFrom']?.secretKeyRef, 'SLUICE_DATABASE_URL from a Secret').toBeDefined();
    const dbSecret = env!['valueFrom'].secretKeyRef as { name: string; key: string };

    // prefix-hash.key and reasoning-keys.json: one Secret's items, mounted read-only into the data directory.
    const keyMounts = ['prefix-hash.key', 'reasoning-keys.json'].map((file) => {
      const m = mounts.find((x) => x['mountPath'] === `${dataDir}/${file}`);
      expect(m, `${file} mounted in ${dataDir}`).toBeDefined();
      expect(m!['readOnly']).toBe(true);
      const secret = volumes.get(m!['name'])!['secret'];
      expect(secret, `${file} from a Secret`).toBeDefined();
      expect((secret.items as Doc[]).find((i) => i['path'] === m!['subPath'])?.['key'], `${file} is an item of ${secret.secretName}`).toBe(file);
      return secret.secretName as string;
    });
    expect(new Set(keyMounts).size, 'one Secret for both files').toBe(1);

    // The Secrets are created by the operator, as the header says how (none is in the file).
    expect(header).toContain(`kubectl create secret generic ${dbSecret.name} --from-literal=${dbSecret.key}=`);
    const keysLine = header.split('\n').find((l) => l.includes(`kubectl create secret generic ${keyMounts[0]} `));
    expect(keysLine, `how to create ${keyMounts[0]}`).toBeDefined();
    for (const file of ['prefix-hash.key', 'reasoning-keys.json']) expect(keysLine).toMatch(new RegExp(`--from-file=\\S*/${file.replace('.', '\\.')}(\\s|$)`));

    // Leases: a killed replica's work moves after --lease-seconds; a drained one hands its leases back within the grace period.
    const lease = Number(flag(args, '--lease-seconds'));
    expect(Number.isInteger(lease) && lease >= 1, `--lease-seconds ${lease}`).toBe(true);
    expect(pod.spec.terminationGracePeriodSeconds).toBeGreaterThan(Number(flag(args, '--drain-seconds')));
  });

  it('passes arguments sluice serve knows, and a catalog it accepts', async () => {
    const c = one('Deployment')['spec'].template.spec.containers[0] as Doc;
    // serve parses its flags before --help answers: an unknown flag exits 1.
    const { stdout } = await run(process.execPath, [CLI, ...(c['args'] as string[]), '--help']);
    expect(stdout).toContain('usage: sluice serve');
    const configMap = one('ConfigMap');
    const config = flag(c['args'] as string[], '--config')!;
    const key = config.split('/').pop()!;
    const catalog = parseCatalog(JSON.parse(configMap['data'][key]), `ConfigMap ${key}`, '/etc/sluice');
    expect(catalog.models.length).toBeGreaterThan(0);
    // The checkpoints are on the models volume.
    const modelsMount = (c['volumeMounts'] as Doc[]).find((m) => m['name'] === 'models')!['mountPath'];
    for (const m of catalog.models) expect(m.checkpoint.startsWith(`${modelsMount}/`), m.checkpoint).toBe(true);
  });
});
