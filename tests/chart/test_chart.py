#!/usr/bin/python3
"""test_chart.py - checks of the Helm chart in helm/tandem (docs/DEPLOY.md).

Always (Python standard library + python3-yaml):
  - Chart.yaml, values.yaml and every examples/*.yaml parse, with no duplicate keys;
  - Chart.yaml's appVersion is the project VERSION from the top-level CMakeLists.txt;
  - every .Values.<path> used in a template exists in values.yaml, and every $w.<path> (a worker
    role's section in the shared worker helpers) exists under both prefill and decode;
  - every key an example values file sets exists in values.yaml (below free-form maps anything
    goes);
  - every workload template (Deployment, StatefulSet), with the helpers it includes expanded,
    carries the app.kubernetes.io/* labels, the role label and startup, readiness and liveness
    probes; every role's probes are on /health (readiness always; startup and liveness unless
    values.yaml names another path for that probe, as the router does).
When the executables are built ($TANDEM_BIN_DIR, set by ctest):
  - every numeric flag the defaults or an example set in a role's `config` (merged over the
    top-level `config`) is within the range that executable's --help states.
When a `helm` binary is on PATH (or named by $TANDEM_HELM):
  - `helm lint --strict` on the defaults and on each example;
  - `helm template` of the defaults, each example and the optional features, then checks of the
    rendered objects (labels, selectors, probes, GPU/RDMA resources, IPC_LOCK, UCX environment,
    flags in the ConfigMaps, per-rack affinity, KEDA and HPA objects);
  - invalid values (bad or duplicate rack names, decode scaled to zero) fail to render.
Without helm those checks are reported as skipped, with the reason.

Prints one line per check and closes with "N passed, N failed, N skipped"; exits 1 on a failure.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:  # pragma: no cover - scripts/setup installs python3-yaml
    print("FAIL python3-yaml is not installed (scripts/setup installs it)")
    print("0 passed, 1 failed")
    sys.exit(1)

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("TANDEM_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
CHART_DIR = os.path.join(SOURCE_DIR, "helm", "tandem")
TEMPLATES_DIR = os.path.join(CHART_DIR, "templates")
EXAMPLES_DIR = os.path.join(CHART_DIR, "examples")

ROLES = ("router", "prefill", "decode")
WORKER_ROLES = ("prefill", "decode")
# Labels every workload and its pods carry (app.kubernetes.io/* plus the role label).
REQUIRED_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
    "tandem/role",
)
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
HEALTH_PATH = "/health"
# values.yaml keys whose contents are free-form (Kubernetes objects, flag maps, env maps).
FREE_FORM_KEYS = {
    "config", "resources", "env", "behavior", "securityContext", "podSecurityContext",
    "nodeSelector", "tolerations", "affinity", "annotations", "labels", "podAnnotations",
    "podLabels", "commonLabels", "topologySpreadConstraints", "resourceClaims", "extraVolumes",
    "extraVolumeMounts", "extraEnv", "imagePullSecrets", "accessModes",
}
GROUP_OVERRIDE_KEYS = {"replicas", "minReplicas", "maxReplicas"}
# The executable each role's `config` flags go to.
ROLE_EXECUTABLES = {"router": "tandem-router", "prefill": "tandem-prefill",
                    "decode": "tandem-decode"}
# A --help line of a numeric flag: "  --pages N   KV pages ... (default 4096) [16..16777216] ..."
HELP_RANGE = re.compile(r"^\s+--([a-z0-9-]+) [A-Z]+\s.*?\[(-?[0-9.e+]+)\.\.(-?[0-9.e+]+)\]")


class Results:
    """Counts and prints check outcomes."""

    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.skipped = 0

    def check(self, name, problems):
        """problems: list of strings; empty means the check passed."""
        if problems:
            self.failed += 1
            print("FAIL %s" % name)
            for problem in problems[:20]:
                print("     %s" % problem)
            if len(problems) > 20:
                print("     ... and %d more" % (len(problems) - 20))
        else:
            self.passed += 1
            print("ok   %s" % name)

    def skip(self, name, reason):
        self.skipped += 1
        print("skip %s: %s" % (name, reason))


class UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a mapping with the same key twice (Kubernetes would too)."""


def _construct_unique_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, "duplicate key %r" % (key,), key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                                _construct_unique_mapping)


def load_yaml_file(path):
    with open(path, encoding="utf-8") as f:
        return yaml.load(f, Loader=UniqueKeyLoader)


def load_yaml_docs(text):
    return [doc for doc in yaml.load_all(text, Loader=UniqueKeyLoader) if doc is not None]


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def template_files():
    out = []
    for root, _, files in os.walk(TEMPLATES_DIR):
        for name in sorted(files):
            if name.endswith((".yaml", ".tpl", ".txt")):
                out.append(os.path.join(root, name))
    return sorted(out)


def example_files():
    if not os.path.isdir(EXAMPLES_DIR):
        return []
    return [os.path.join(EXAMPLES_DIR, n) for n in sorted(os.listdir(EXAMPLES_DIR))
            if n.endswith(".yaml")]


def rel(path):
    return os.path.relpath(path, SOURCE_DIR)


# ------------------------------------------------------------------------------------------------
# Static checks (no helm).

def check_parse(results):
    problems = []
    parsed = {}
    for path in [os.path.join(CHART_DIR, "Chart.yaml"), os.path.join(CHART_DIR, "values.yaml")] \
            + example_files():
        try:
            parsed[path] = load_yaml_file(path)
        except (OSError, yaml.YAMLError) as e:
            problems.append("%s: %s" % (rel(path), e))
            continue
        if not isinstance(parsed[path], dict):
            problems.append("%s: top level is not a mapping" % rel(path))
    results.check("Chart.yaml, values.yaml and examples/*.yaml parse (no duplicate keys)",
                  problems)
    return parsed


def check_chart_metadata(results, chart):
    problems = []
    if not isinstance(chart, dict):
        results.check("Chart.yaml metadata", ["Chart.yaml did not parse"])
        return
    if chart.get("apiVersion") != "v2":
        problems.append("apiVersion is %r, want v2" % chart.get("apiVersion"))
    if chart.get("name") != "tandem":
        problems.append("name is %r, want tandem" % chart.get("name"))
    if not re.match(r"^\d+\.\d+\.\d+([-+].*)?$", str(chart.get("version", ""))):
        problems.append("version %r is not semver" % chart.get("version"))
    if chart.get("type", "application") != "application":
        problems.append("type is %r, want application" % chart.get("type"))
    cmake = read(os.path.join(SOURCE_DIR, "CMakeLists.txt"))
    m = re.search(r"project\(\s*tandem\b[^)]*\bVERSION\s+([0-9.]+)", cmake)
    if m is None:
        problems.append("no project VERSION in CMakeLists.txt")
    elif str(chart.get("appVersion")) != m.group(1):
        problems.append("appVersion %r differs from the project VERSION %s"
                        % (chart.get("appVersion"), m.group(1)))
    results.check("Chart.yaml: apiVersion v2, semver version, appVersion = project VERSION",
                  problems)


def lookup(values, dotted):
    """True if the dotted path exists in values (a path may stop at any value)."""
    node = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


VALUES_REF = re.compile(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
WORKER_REF = re.compile(r"\$w((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def check_values_paths(results, values):
    problems = []
    n_refs = 0
    for path in template_files():
        text = read(path)
        for lineno, line in enumerate(text.splitlines(), 1):
            for m in VALUES_REF.finditer(line):
                n_refs += 1
                dotted = m.group(1)[1:]
                if not lookup(values, dotted):
                    problems.append("%s:%d: .Values.%s is not in values.yaml"
                                    % (rel(path), lineno, dotted))
            for m in WORKER_REF.finditer(line):
                n_refs += 1
                dotted = m.group(1)[1:]
                for role in WORKER_ROLES:
                    if not lookup(values, "%s.%s" % (role, dotted)):
                        problems.append("%s:%d: $w.%s is not in values.yaml under %s"
                                        % (rel(path), lineno, dotted, role))
    if n_refs == 0:
        problems.append("no .Values references found: is %s the chart?" % rel(TEMPLATES_DIR))
    results.check("every .Values path (%d uses) used in a template exists in values.yaml"
                  % n_refs, problems)


def walk_example(example, defaults, prefix, problems, source):
    for key, value in example.items():
        path = "%s.%s" % (prefix, key) if prefix else str(key)
        if not isinstance(defaults, dict) or key not in defaults:
            problems.append("%s: %s is not in values.yaml" % (source, path))
            continue
        if key in FREE_FORM_KEYS or value is None:
            continue
        default = defaults[key]
        if key == "racks":
            for i, group in enumerate(value or []):
                for gkey, gvalue in (group or {}).items():
                    if gkey in ("name", "domain"):
                        continue
                    if gkey not in WORKER_ROLES:
                        problems.append("%s: racks[%d].%s is not a rack-group key"
                                        % (source, i, gkey))
                        continue
                    for okey in (gvalue or {}):
                        if okey not in GROUP_OVERRIDE_KEYS:
                            problems.append("%s: racks[%d].%s.%s is not an override (%s)"
                                            % (source, i, gkey, okey,
                                               ", ".join(sorted(GROUP_OVERRIDE_KEYS))))
            continue
        if isinstance(value, dict) and isinstance(default, dict) and default:
            walk_example(value, default, path, problems, source)


def check_examples(results, parsed, values):
    problems = []
    files = example_files()
    if not files:
        problems.append("no examples/*.yaml")
    for path in files:
        example = parsed.get(path)
        if isinstance(example, dict):
            walk_example(example, values, "", problems, rel(path))
    results.check("every key the examples set exists in values.yaml (%d files)" % len(files),
                  problems)


DEFINE = re.compile(r'\{\{-?\s*define\s+"([^"]+)"\s*-?\}\}(.*?)\{\{-?\s*end\s*-?\}\}\s*'
                    r'(?=\{\{-?\s*/\*|\{\{-?\s*define|\Z)', re.S)
INCLUDE = re.compile(r'(?:include|template)\s+"([^"]+)"')


def flag_ranges(executable):
    """flag name -> (min, max) from `executable --help`."""
    out = subprocess.run([executable, "--help"], capture_output=True, text=True, timeout=30)
    ranges = {}
    for line in out.stdout.splitlines():
        match = HELP_RANGE.match(line)
        if match:
            ranges[match.group(1)] = (match.group(2), match.group(3))
    return ranges


def check_flag_ranges(results, parsed, values):
    """Numeric role flags of the defaults and each example within the executables' ranges."""
    name = "flag values in role configs are within the executables' --help ranges"
    bin_dir = os.environ.get("TANDEM_BIN_DIR")
    missing = [exe for exe in ROLE_EXECUTABLES.values()
               if not bin_dir or not os.access(os.path.join(bin_dir, exe), os.X_OK)]
    if missing:
        results.skip(name, "not built in $TANDEM_BIN_DIR: %s" % ", ".join(missing))
        return
    ranges = {role: flag_ranges(os.path.join(bin_dir, exe))
              for role, exe in ROLE_EXECUTABLES.items()}
    problems = []
    n_checked = 0
    sources = [("values.yaml", {})] + [(rel(path), parsed.get(path) or {})
                                       for path in example_files()]
    for source, example in sources:
        for role in ROLES:
            config = dict(values.get("config") or {})
            config.update((values.get(role) or {}).get("config") or {})
            config.update(example.get("config") or {})
            config.update((example.get(role) or {}).get("config") or {})
            for flag, value in config.items():
                if flag not in ranges[role] or value is None or value == "":
                    continue
                n_checked += 1
                low, high = ranges[role][flag]
                try:
                    number = float(value)
                except (TypeError, ValueError):
                    problems.append("%s: %s.config.%s=%r is not a number"
                                    % (source, role, flag, value))
                    continue
                if not float(low) <= number <= float(high):
                    problems.append("%s: %s.config.%s=%s is outside %s's range %s..%s"
                                    % (source, role, flag, value, ROLE_EXECUTABLES[role], low,
                                       high))
    results.check("%s (%d values)" % (name, n_checked), problems)


def helper_defines():
    """define name -> body, from every .tpl file."""
    defines = {}
    for path in template_files():
        if path.endswith(".tpl"):
            for m in DEFINE.finditer(read(path)):
                defines[m.group(1)] = m.group(2)
    return defines


def expand(text, defines, seen=None):
    """The text with the body of every helper it includes (transitively) appended."""
    seen = set() if seen is None else seen
    out = [text]
    for name in INCLUDE.findall(text):
        if name in defines and name not in seen:
            seen.add(name)
            out.append(expand(defines[name], defines, seen))
    return "\n".join(out)


def probe_path(values, role, kind):
    """The path a role's probe uses by default: its own `path`, else the role's probes.path."""
    probes = (values.get(role) or {}).get("probes") or {}
    return (probes.get(kind) or {}).get("path") or probes.get("path")


def check_workload_templates(results, values):
    defines = helper_defines()
    problems = []
    workloads = []
    for path in template_files():
        text = read(path)
        if re.search(r"^kind:\s*(Deployment|StatefulSet)\s*$", text, re.M):
            workloads.append(path)
            full = expand(text, defines)
            for label in REQUIRED_LABELS:
                if "%s:" % label not in full:
                    problems.append("%s: no %s label" % (rel(path), label))
            for probe in PROBES:
                if "%s:" % probe not in full:
                    problems.append("%s: no %s" % (rel(path), probe))
            if "httpGet:" not in full:
                problems.append("%s: probes are not HTTP GETs" % rel(path))
            if "selectorLabels" not in text:
                problems.append("%s: selector does not use tandem.selectorLabels" % rel(path))
    roles_seen = set()
    for path in workloads:
        base = os.path.basename(path)
        for role in ROLES:
            if base.startswith(role + "-"):
                roles_seen.add(role)
    for role in ROLES:
        if role not in roles_seen:
            problems.append("no workload template for %s" % role)
        probes = (values.get(role) or {}).get("probes") or {}
        if probes.get("path") != HEALTH_PATH:
            problems.append("values.yaml %s.probes.path is %r, want %s"
                            % (role, probes.get("path"), HEALTH_PATH))
        for kind in ("startup", "readiness", "liveness"):
            if not isinstance(probes.get(kind), dict):
                problems.append("values.yaml %s.probes.%s missing" % (role, kind))
        if probe_path(values, role, "readiness") != HEALTH_PATH:
            problems.append("values.yaml %s readiness probe is not on %s" % (role, HEALTH_PATH))
    results.check("workload templates (%d) carry app.kubernetes.io/* + role labels and "
                  "startup/readiness/liveness probes on /health" % len(workloads), problems)


# ------------------------------------------------------------------------------------------------
# Checks with helm.

def find_helm():
    helm = os.environ.get("TANDEM_HELM") or shutil.which("helm")
    if not helm:
        return None, "helm not on PATH (set TANDEM_HELM to a helm binary to run these checks)"
    try:
        out = subprocess.run([helm, "version", "--short"], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, "%s does not run: %s" % (helm, e)
    if out.returncode != 0:
        return None, "%s version failed: %s" % (helm, out.stderr.strip())
    return helm, out.stdout.strip()


def run_helm(helm, args):
    env = dict(os.environ)
    # Keep helm away from the user's config, cache and any cluster.
    scratch = tempfile.mkdtemp(prefix="tandem-helm-")
    env.update({"HELM_CACHE_HOME": scratch, "HELM_CONFIG_HOME": scratch,
                "HELM_DATA_HOME": scratch, "KUBECONFIG": os.path.join(scratch, "none")})
    try:
        return subprocess.run([helm] + args, capture_output=True, text=True, timeout=120,
                              env=env)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def render(helm, value_args, namespace="tandem"):
    """(objects, error) for `helm template` with the given -f/--set arguments."""
    out = run_helm(helm, ["template", "t", CHART_DIR, "--namespace", namespace] + value_args)
    if out.returncode != 0:
        return None, (out.stderr or out.stdout).strip()
    try:
        return load_yaml_docs(out.stdout), None
    except yaml.YAMLError as e:
        return None, "rendered YAML does not parse: %s" % e


def labels_problems(where, labels):
    problems = []
    for label in REQUIRED_LABELS:
        if not (labels or {}).get(label):
            problems.append("%s: label %s missing" % (where, label))
    return problems


def container_env(container):
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def check_rendered_objects(objects, expect_gpu, values):
    """Problems in one render (default probe paths from values): workloads, services, config
    maps."""
    problems = []
    by_kind = {}
    for obj in objects:
        by_kind.setdefault(obj.get("kind"), []).append(obj)
    config_maps = {o["metadata"]["name"]: o.get("data") or {} for o in by_kind.get("ConfigMap", [])}
    service_names = {o["metadata"]["name"] for o in by_kind.get("Service", [])}
    workloads = by_kind.get("Deployment", []) + by_kind.get("StatefulSet", [])
    roles = set()
    for obj in workloads:
        name = "%s/%s" % (obj["kind"], obj["metadata"]["name"])
        meta_labels = obj["metadata"].get("labels") or {}
        pod = obj["spec"]["template"]
        pod_labels = pod["metadata"].get("labels") or {}
        problems += labels_problems(name, meta_labels)
        problems += labels_problems(name + " pod template", pod_labels)
        role = pod_labels.get("tandem/role")
        roles.add(role)
        selector = obj["spec"]["selector"]["matchLabels"]
        for key, value in selector.items():
            if pod_labels.get(key) != value:
                problems.append("%s: selector %s=%s does not match the pod labels"
                                % (name, key, value))
        if role in WORKER_ROLES and "tandem/rack" not in selector:
            problems.append("%s: selector has no tandem/rack" % name)
        if obj["kind"] == "StatefulSet" and obj["spec"].get("serviceName") not in service_names:
            problems.append("%s: serviceName %r is not a rendered Service"
                            % (name, obj["spec"].get("serviceName")))
        for container in pod["spec"]["containers"]:
            cname = "%s container %s" % (name, container["name"])
            port_names = {p.get("name") for p in container.get("ports") or []}
            for probe in PROBES:
                spec = container.get(probe)
                if not spec:
                    problems.append("%s: no %s" % (cname, probe))
                    continue
                http = spec.get("httpGet") or {}
                want = probe_path(values, role, probe[:-len("Probe")]) if role in ROLES \
                    else HEALTH_PATH
                if http.get("path") != want:
                    problems.append("%s: %s path %r, want %s"
                                    % (cname, probe, http.get("path"), want))
                if http.get("port") not in port_names:
                    problems.append("%s: %s port %r is not a container port"
                                    % (cname, probe, http.get("port")))
            cm_refs = [e["configMapRef"]["name"] for e in container.get("envFrom") or []
                       if "configMapRef" in e]
            if not cm_refs or any(ref not in config_maps for ref in cm_refs):
                problems.append("%s: envFrom ConfigMap %r not rendered" % (cname, cm_refs))
                continue
            flags = {}
            for ref in cm_refs:
                flags.update(config_maps[ref])
            if not flags.get("TANDEM_MODEL"):
                problems.append("%s: no TANDEM_MODEL" % cname)
            if not re.match(r"^0\.0\.0\.0:\d+$", flags.get("TANDEM_HTTP", "")):
                problems.append("%s: TANDEM_HTTP %r" % (cname, flags.get("TANDEM_HTTP")))
            n_routers = int((values.get("router") or {}).get("replicas", 1))
            if role == "router":
                if not re.match(r"^tcp://0\.0\.0\.0:\d+$", flags.get("TANDEM_CONTROL", "")):
                    problems.append("%s: TANDEM_CONTROL %r"
                                    % (cname, flags.get("TANDEM_CONTROL")))
                # issue 18 item 3: every router lists all of them (docs/ROUTERS.md)
                env = container_env(container)
                peers = [p for p in (env.get("TANDEM_PEERS") or "").split(",") if p]
                if len(peers) != n_routers or not all(
                        re.match(r"^[a-z0-9-]+=tcp://[a-z0-9.-]+:\d+$", p) for p in peers):
                    problems.append("%s: TANDEM_PEERS %r is not %d ID=tcp://HOST:PORT"
                                    % (cname, env.get("TANDEM_PEERS"), n_routers))
                if "TANDEM_ROUTER_ID" not in env:
                    problems.append("%s: no TANDEM_ROUTER_ID" % cname)
                continue
            # every router's control address (router pod DNS names under the peers Service)
            addrs = [a for a in flags.get("TANDEM_ROUTER", "").split(",") if a]
            if len(addrs) != n_routers or not all(
                    re.match(r"^tcp://[a-z0-9.-]+:\d+$", a) for a in addrs):
                problems.append("%s: TANDEM_ROUTER %r is not %d router addresses"
                                % (cname, flags.get("TANDEM_ROUTER"), n_routers))
            else:
                for addr in addrs:
                    labels = addr[len("tcp://"):].split(".")
                    if len(labels) < 2 or labels[1] not in service_names:
                        problems.append("%s: TANDEM_ROUTER %s is not under a rendered Service"
                                        % (cname, addr))
            if not any(k.startswith("UCX_") for k in flags):
                problems.append("%s: no UCX_* environment" % cname)
            env = container_env(container)
            if env.get("TANDEM_RACK") != pod_labels.get("tandem/rack"):
                problems.append("%s: TANDEM_RACK %r differs from the rack label %r"
                                % (cname, env.get("TANDEM_RACK"), pod_labels.get("tandem/rack")))
            caps = ((container.get("securityContext") or {}).get("capabilities") or {})
            if "IPC_LOCK" not in (caps.get("add") or []):
                problems.append("%s: no IPC_LOCK capability" % cname)
            if expect_gpu:
                limits = (container.get("resources") or {}).get("limits") or {}
                for resource in ("nvidia.com/gpu", "rdma/ib"):
                    if resource not in limits:
                        problems.append("%s: no %s limit" % (cname, resource))
    for role in ROLES:
        if role not in roles:
            problems.append("no %s workload rendered" % role)
    return problems, by_kind


def worker_affinity(obj):
    return obj["spec"]["template"]["spec"].get("affinity") or {}


def check_with_helm(results, helm, values):
    examples = example_files()
    lint_sets = [("defaults", [])] + [("examples/" + os.path.basename(p), ["-f", p])
                                      for p in examples]
    problems = []
    for name, args in lint_sets:
        out = run_helm(helm, ["lint", "--strict", CHART_DIR] + args)
        if out.returncode != 0:
            problems.append("%s: %s" % (name, (out.stdout + out.stderr).strip()[-2000:]))
    results.check("helm lint --strict (defaults and %d examples)" % len(examples), problems)

    renders = [
        ("defaults", [], True),
        ("autoscaling keda, ServiceMonitor, spill pvc, model random",
         ["--set", "prefill.autoscaling.enabled=true", "--set", "decode.autoscaling.enabled=true",
          "--set", "monitoring.serviceMonitor.enabled=true", "--set", "decode.spill.type=pvc",
          "--set", "model.source=random"], True),
        ("autoscaling hpa, model hostPath, topology preferred",
         ["--set", "prefill.autoscaling.enabled=true", "--set", "decode.autoscaling.enabled=true",
          "--set", "autoscaling.engine=hpa", "--set", "model.source=hostPath",
          "--set", "topology.mode=preferred"], True),
    ]
    for path in examples:
        renders.append(("examples/" + os.path.basename(path), ["-f", path],
                        "dev" not in os.path.basename(path)))
    rendered = {}
    for name, args, expect_gpu in renders:
        objects, error = render(helm, args)
        if error:
            results.check("helm template: %s" % name, [error[-2000:]])
            continue
        problems, by_kind = check_rendered_objects(objects, expect_gpu, values)
        rendered[name] = by_kind
        results.check("helm template: %s renders labelled, probed workloads" % name, problems)

    by_kind = rendered.get("autoscaling keda, ServiceMonitor, spill pvc, model random")
    if by_kind is not None:
        problems = []
        scaled = {o["spec"]["scaleTargetRef"]["name"]: o for o in by_kind.get("ScaledObject", [])}
        for obj in by_kind.get("Deployment", []) + by_kind.get("StatefulSet", []):
            role = obj["spec"]["template"]["metadata"]["labels"]["tandem/role"]
            if role == "router":
                continue
            name = obj["metadata"]["name"]
            if "replicas" in obj["spec"]:
                problems.append("%s sets replicas while autoscaled" % name)
            so = scaled.get(name)
            if so is None:
                problems.append("no ScaledObject targets %s" % name)
                continue
            if so["spec"]["scaleTargetRef"]["kind"] != obj["kind"]:
                problems.append("ScaledObject %s targets kind %s"
                                % (name, so["spec"]["scaleTargetRef"]["kind"]))
            trigger = so["spec"]["triggers"][0]
            query = trigger["metadata"]["query"]
            want = ("tandem_router_prefill_backlog_seconds" if role == "prefill"
                    else "tandem_router_kv_occupancy")
            rack = obj["spec"]["template"]["metadata"]["labels"]["tandem/rack"]
            if trigger["type"] != "prometheus" or want not in query or \
                    'rack="%s"' % rack not in query or "{{" in query:
                problems.append("ScaledObject %s: query %r" % (name, query))
        if not by_kind.get("ServiceMonitor"):
            problems.append("no ServiceMonitor rendered")
        statefulsets = by_kind.get("StatefulSet", [])
        if not statefulsets or not all(s["spec"].get("volumeClaimTemplates")
                                       for s in statefulsets):
            problems.append("decode StatefulSets have no spill volumeClaimTemplates")
        for s in statefulsets:
            # the spill volume is the decode node's disk tier: --spill-dir is its mount path
            mounts = {m["name"]: m["mountPath"]
                      for c in s["spec"]["template"]["spec"]["containers"]
                      for m in c.get("volumeMounts") or []}
            envs = [container_env(c) for c in s["spec"]["template"]["spec"]["containers"]]
            if not any(e.get("TANDEM_SPILL_DIR") == mounts.get("spill") for e in envs) or \
                    "spill" not in mounts:
                problems.append("%s: TANDEM_SPILL_DIR is not the spill volume's mount path"
                                % s["metadata"]["name"])
        for obj in by_kind.get("Deployment", []) + statefulsets:
            init = obj["spec"]["template"]["spec"].get("initContainers") or []
            if not any("tandem-mkmodel" in (c.get("command") or []) for c in init):
                problems.append("%s: no tandem-mkmodel init container with model.source random"
                                % obj["metadata"]["name"])
        if by_kind.get("PersistentVolumeClaim"):
            problems.append("a model PVC rendered although model.source is random")
        results.check("KEDA ScaledObjects per role and rack on backlog seconds / KV occupancy",
                      problems)

    by_kind = rendered.get("autoscaling hpa, model hostPath, topology preferred")
    if by_kind is not None:
        problems = []
        hpas = by_kind.get("HorizontalPodAutoscaler", [])
        if len(hpas) != 2 or by_kind.get("ScaledObject"):
            problems.append("want 2 HPAs and no ScaledObject, got %d HPAs" % len(hpas))
        for obj in by_kind.get("Deployment", []) + by_kind.get("StatefulSet", []):
            volumes = obj["spec"]["template"]["spec"].get("volumes") or []
            if not any(v.get("name") == "model" and "hostPath" in v for v in volumes):
                problems.append("%s: model volume is not a hostPath" % obj["metadata"]["name"])
        results.check("HPA engine and hostPath model volume", problems)

    two_rack = [p for p in examples if "nvl72" in os.path.basename(p)]
    if two_rack:
        by_kind = rendered.get("examples/" + os.path.basename(two_rack[0]))
        problems = []
        if by_kind is None:
            problems.append("did not render")
        else:
            example = load_yaml_file(two_rack[0])
            domains = {g["name"]: g["domain"] for g in example["racks"]}
            workers = [o for o in by_kind.get("Deployment", []) + by_kind.get("StatefulSet", [])
                       if o["spec"]["template"]["metadata"]["labels"]["tandem/role"] != "router"]
            if len(workers) != 2 * len(domains):
                problems.append("want a prefill Deployment and a decode StatefulSet per rack, "
                                "got %d workloads for %d racks" % (len(workers), len(domains)))
            for obj in workers:
                rack = obj["spec"]["template"]["metadata"]["labels"]["tandem/rack"]
                terms = (worker_affinity(obj).get("nodeAffinity") or {}) \
                    .get("requiredDuringSchedulingIgnoredDuringExecution", {}) \
                    .get("nodeSelectorTerms", [])
                pinned = [e for t in terms for e in t.get("matchExpressions", [])
                          if e.get("key") == "nvidia.com/gpu.clique"
                          and e.get("values") == [domains.get(rack)]]
                if not pinned:
                    problems.append("%s is not pinned to %s's NVLink domain"
                                    % (obj["metadata"]["name"], rack))
        results.check("two NVL72 racks: each rack's workloads pinned to its NVLink domain",
                      problems)

    objects, error = render(helm, [])
    if objects is not None:
        problems = []
        for obj in objects:
            if obj.get("kind") in ("Deployment", "StatefulSet") and \
                    obj["spec"]["template"]["metadata"]["labels"]["tandem/role"] != "router":
                term = (worker_affinity(obj).get("podAffinity") or {}) \
                    .get("requiredDuringSchedulingIgnoredDuringExecution") or []
                if not term or term[0].get("topologyKey") != "nvidia.com/gpu.clique":
                    problems.append("%s: no required pod affinity on nvidia.com/gpu.clique"
                                    % obj["metadata"]["name"])
        results.check("defaults: a floating rack group's prefill and decode share one domain",
                      problems)

    bad_values = [
        ("rack name with capitals", "racks:\n  - name: Rack_A\n", "racks: name"),
        ("duplicate rack names", "racks:\n  - name: a\n  - name: a\n", "appears twice"),
        ("no rack groups", "racks: []\n", "at least one rack group"),
        ("decode autoscaled to zero",
         "decode:\n  autoscaling:\n    enabled: true\n    minReplicas: 0\n", "at least 1"),
        ("unknown model source", "model:\n  source: s3\n", "model.source"),
    ]
    problems = []
    for name, text, want in bad_values:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write(text)
            path = f.name
        try:
            objects, error = render(helm, ["-f", path])
        finally:
            os.unlink(path)
        if error is None:
            problems.append("%s: rendered without error" % name)
        elif want not in error:
            problems.append("%s: error does not mention %r: %s" % (name, want, error[-300:]))
    results.check("invalid values fail to render with a clear message (%d cases)"
                  % len(bad_values), problems)


def main():
    results = Results()
    print("chart: %s" % CHART_DIR)
    parsed = check_parse(results)
    chart = parsed.get(os.path.join(CHART_DIR, "Chart.yaml"))
    values = parsed.get(os.path.join(CHART_DIR, "values.yaml"))
    check_chart_metadata(results, chart)
    if isinstance(values, dict):
        check_values_paths(results, values)
        check_examples(results, parsed, values)
        check_workload_templates(results, values)
        check_flag_ranges(results, parsed, values)
    else:
        results.check("values.yaml is a mapping", ["values.yaml did not parse"])

    helm, info = find_helm()
    if not isinstance(values, dict):
        results.skip("helm lint and helm template", "values.yaml did not parse")
    elif helm is None:
        results.skip("helm lint and helm template", info)
    else:
        print("helm: %s (%s)" % (helm, info))
        check_with_helm(results, helm, values)

    print("%d passed, %d failed, %d skipped" % (results.passed, results.failed, results.skipped))
    return 1 if results.failed else 0


if __name__ == "__main__":
    sys.exit(main())
