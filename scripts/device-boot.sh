# Sourced at the start of a device command (copied to .device/boot.sh by device-check.sh --pack):
# unpacks the Node runtime and node_modules packed into .device/, for a GPU host that has neither.
# Idempotent on one machine.
if [[ ! -x /tmp/sluice-node/node ]]; then
  mkdir -p /tmp/sluice-node
  xz -dc .device/node.xz > /tmp/sluice-node/node && chmod +x /tmp/sluice-node/node || return 1
fi
export PATH=/tmp/sluice-node:$PATH
[[ -d node_modules ]] || tar -xJf .device/node_modules.tar.xz || return 1
node --version && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
