"""A test stand-in for Beaker on 127.0.0.1, for exactly the calls `tinkrl launch beaker` makes through
the real `beaker-py` client.

beaker-py talks to two endpoints: gRPC (`rpc_address`, always TLS) for reads, and HTTP
(`agent_address`) for creating experiments and writing secrets. The gRPC side here is beaker-py's own
generated service (`beaker_pb2_grpc.BeakerServicer`, registered with `add_BeakerServicer_to_server`)
over TLS with a self-signed certificate for 127.0.0.1 (a client trusts it through
`GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`); the HTTP side is a small `http.server`. Both check the bearer
token. Implemented: ResolveOrganizationName, ResolveWorkspaceName, GetUser, ResolveImageName,
GetImage, GetSecret, GetWorkload, ListJobs, GetJob, StreamJobLogs; `POST
/api/v3/workspaces/{id}/experiments` and `PUT /api/v3/workspaces/{id}/secrets/{name}/value`.
Anything else answers UNIMPLEMENTED / 404, as a server that lacks it would.

An experiment gets one task and one job at once; following its logs streams the job's scripted
lines, then finalizes it with the scripted exit code.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import threading
import time
import uuid
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

import grpc
import yaml
from beaker import beaker_pb2 as pb2
from beaker import beaker_pb2_grpc
from google.protobuf.timestamp_pb2 import Timestamp

from helpers.http_json import send_json

TOKEN = "beaker-test-token"


def self_signed_cert(directory: Path) -> tuple[bytes, bytes, Path]:
    """(key PEM, certificate PEM, certificate file) for 127.0.0.1 and localhost."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    path = directory / "beaker-test-ca.pem"
    path.write_bytes(cert_pem)
    return key_pem, cert_pem, path


def _now() -> Timestamp:
    ts = Timestamp()
    ts.GetCurrentTime()
    return ts


@dataclass
class JobScript:
    """What the one job of the next experiment prints (one log message per line) and its exit code."""

    lines: list[str] = field(default_factory=lambda: ["hello from the job"])
    exit_code: int = 0
    line_delay_s: float = 0.01


@dataclass
class BeakerState:
    """The stand-in's data: a user, an organization, workspaces, images, secrets, experiments, jobs."""

    user: str = "alice"
    org: str = "ai2"
    workspaces: dict[str, str] = field(default_factory=lambda: {"ai2/davidh": "01WSDAVIDH"})
    images: dict[str, str] = field(default_factory=dict)  # full name -> id
    secrets: dict[tuple[str, str], str] = field(default_factory=dict)  # (workspace id, name) -> value
    experiments: list[dict] = field(default_factory=list)  # what POST .../experiments received
    secret_writes: list[tuple[str, str]] = field(default_factory=list)  # (workspace id, name)
    workloads: dict[str, pb2.Workload] = field(default_factory=dict)
    jobs: dict[str, pb2.Job] = field(default_factory=dict)
    scripts: dict[str, JobScript] = field(default_factory=dict)  # job id -> script
    next_script: JobScript = field(default_factory=JobScript)
    calls: list[str] = field(default_factory=list)  # every gRPC method called, in order
    lock: threading.Lock = field(default_factory=threading.Lock)

    def create_experiment(self, workspace_id: str, name: str | None, spec: dict) -> str:
        exp_id, task_id, job_id = (f"01{kind}{uuid.uuid4().hex[:10].upper()}" for kind in ("EXP", "TSK", "JOB"))
        with self.lock:
            self.experiments.append({"workspace_id": workspace_id, "name": name, "spec": spec})
            task = pb2.Task(id=task_id, experiment_id=exp_id, name=spec["tasks"][0].get("name", "main"))
            exp = pb2.Experiment(id=exp_id, name=name or "", workspace_id=workspace_id, tasks=[task], created=_now())
            self.workloads[exp_id] = pb2.Workload(experiment=exp)
            self.jobs[job_id] = pb2.Job(
                id=job_id, task_id=task_id, workload_id=exp_id, status=pb2.JobStatus(created=_now())
            )
            self.scripts[job_id] = self.next_script
        return exp_id


class Servicer(beaker_pb2_grpc.BeakerServicer):
    """The gRPC methods beaker-py calls for tinkrl launch beaker."""

    def __init__(self, state: BeakerState):
        self.state = state

    def _auth(self, name: str, context) -> None:
        self.state.calls.append(name)
        if dict(context.invocation_metadata()).get("authorization") != f"bearer {TOKEN}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid token")

    def ResolveOrganizationName(self, request, context):
        self._auth("ResolveOrganizationName", context)
        if request.organization_name != self.state.org:
            context.abort(grpc.StatusCode.NOT_FOUND, f"organization {request.organization_name} not found")
        return pb2.ResolveOrganizationNameResponse(organization_id="01ORGAI2")

    @staticmethod
    def _find(table: dict, key, what: str, context):
        if key not in table:
            context.abort(grpc.StatusCode.NOT_FOUND, f"{what} {key} not found")
        return table[key]

    def ResolveWorkspaceName(self, request, context):
        self._auth("ResolveWorkspaceName", context)
        full = f"{request.owner_name}/{request.workspace_name}"
        return pb2.ResolveWorkspaceNameResponse(
            workspace_id=self._find(self.state.workspaces, full, "workspace", context)
        )

    def GetUser(self, request, context):
        self._auth("GetUser", context)
        return pb2.GetUserResponse(user=pb2.User(id="01USERALICE", name=self.state.user))

    def ResolveImageName(self, request, context):
        self._auth("ResolveImageName", context)
        full = f"{request.author_name}/{request.image_name}"
        return pb2.ResolveImageNameResponse(image_id=self._find(self.state.images, full, "image", context))

    def GetImage(self, request, context):
        self._auth("GetImage", context)
        for full, image_id in self.state.images.items():
            if image_id == request.image_id:
                return pb2.GetImageResponse(image=pb2.Image(id=image_id, name=full.split("/")[1], full_name=full))
        context.abort(grpc.StatusCode.NOT_FOUND, f"image {request.image_id} not found")

    def GetSecret(self, request, context):
        self._auth("GetSecret", context)
        if (request.workspace_id, request.secret_name) not in self.state.secrets:
            context.abort(grpc.StatusCode.NOT_FOUND, f"secret {request.secret_name} not found")
        return pb2.GetSecretResponse(secret=pb2.Secret(name=request.secret_name))

    def GetWorkload(self, request, context):
        self._auth("GetWorkload", context)
        workload = self._find(self.state.workloads, request.workload_id, "workload", context)
        return pb2.GetWorkloadResponse(workload=workload)

    def ListJobs(self, request, context):
        self._auth("ListJobs", context)
        jobs = [j for j in self.state.jobs.values() if j.task_id == request.options.task_id]
        return pb2.ListJobsResponse(jobs=jobs)

    def GetJob(self, request, context):
        self._auth("GetJob", context)
        return pb2.GetJobResponse(job=self._find(self.state.jobs, request.job_id, "job", context))

    def StreamJobLogs(self, request, context):
        self._auth("StreamJobLogs", context)
        script = self.state.scripts[request.job_id]
        job = self.state.jobs[request.job_id]
        job.status.started.CopyFrom(_now())
        for line in script.lines:
            time.sleep(script.line_delay_s)
            yield pb2.JobLog(timestamp=_now(), message=line.encode())
        job.status.exit_code = script.exit_code
        job.status.exited.CopyFrom(_now())
        job.status.finalized.CopyFrom(_now())


def _http_handler(state: BeakerState):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _reply(self, code: int, body: dict) -> None:
            send_json(self, code, body)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _route(self) -> tuple[list[str], dict] | None:
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._reply(401, {"message": "invalid token"})
                return None
            url = urlparse(self.path)
            return [unquote(p) for p in url.path.strip("/").split("/")], parse_qs(url.query)

        def do_POST(self):
            routed = self._route()
            if routed is None:
                return
            parts, query = routed
            if len(parts) == 5 and parts[:3] == ["api", "v3", "workspaces"] and parts[4] == "experiments":
                spec = json.loads(self._body())
                exp_id = state.create_experiment(parts[3], (query.get("name") or [None])[0], spec)
                return self._reply(200, {"id": exp_id})
            self._reply(404, {"message": f"no route {self.path}"})

        def do_PUT(self):
            routed = self._route()
            if routed is None:
                return
            parts, _ = routed
            if len(parts) == 7 and parts[:3] == ["api", "v3", "workspaces"] and parts[4::2] == ["secrets", "value"]:
                with state.lock:
                    state.secrets[(parts[3], parts[5])] = self._body().decode()
                    state.secret_writes.append((parts[3], parts[5]))
                return self._reply(200, {})
            self._reply(404, {"message": f"no route {self.path}"})

    return Handler


class BeakerStandIn:
    """Both endpoints running on loopback, and the config file and environment a client needs."""

    def __init__(self, directory: Path, state: BeakerState | None = None):
        self.state = state or BeakerState()
        key, cert, self.ca_file = self_signed_cert(directory)
        self.grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        beaker_pb2_grpc.add_BeakerServicer_to_server(Servicer(self.state), self.grpc)
        self.rpc_port = self.grpc.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), _http_handler(self.state))
        self.config_file = directory / "beaker-config.yml"
        self.config_file.write_text(
            yaml.safe_dump(
                {
                    "user_token": TOKEN,
                    "agent_address": f"http://127.0.0.1:{self.http.server_address[1]}",
                    "rpc_address": f"127.0.0.1:{self.rpc_port}",
                    "default_org": self.state.org,
                }
            )
        )

    def start(self) -> BeakerStandIn:
        self.grpc.start()
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.grpc.stop(grace=None)
        self.http.shutdown()
        self.http.server_close()

    def client_env(self) -> dict[str, str]:
        """Environment for a process whose beaker-py should talk to this stand-in."""
        return {"BEAKER_CONFIG": str(self.config_file), "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(self.ca_file)}
