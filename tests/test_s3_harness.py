"""The S3 harness itself (tests/s3_helpers.py), driven with boto3: moto on
loopback, and the fault proxy the s3 tests put between it and the server
under test. What the server's S3 tests rely on is proven here first."""

from __future__ import annotations

import concurrent.futures
import hashlib
import http.client
import os

import pytest
from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import ClientError, ConnectionClosedError
from botocore.exceptions import ConnectionError as BotoConnectionError

from helpers import until

pytestmark = pytest.mark.s3

MiB = 1 << 20
# What a connection reset or refused is to boto3 (a timeout is not: it
# would mean the proxy hung).
CUT = (ConnectionClosedError, BotoConnectionError)


def _file(path, size: int) -> str:
    """A file of ``size`` bytes no two MiB alike; its sha256."""
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for i in range(0, size, MiB):
            block = hashlib.sha256(b"%d" % i).digest() * (MiB // 32)
            block = block[: min(MiB, size - i)]
            h.update(block)
            f.write(block)
    return h.hexdigest()


def _sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(MiB):
            h.update(block)
    return h.hexdigest()


def _no_retries(moto, proxy):
    return moto.boto3(proxy.endpoint, retries={"total_max_attempts": 1, "mode": "standard"},
                      connect_timeout=5, read_timeout=60)


def test_objects_pass_through_the_proxy_bytes_equal(moto, s3_bucket, fault_proxy, tmp_path):
    from boto3.s3.transfer import TransferConfig

    s3 = moto.boto3(fault_proxy.endpoint)
    s3.put_object(Bucket=s3_bucket, Key="small", Body=b"hello")
    assert s3.get_object(Bucket=s3_bucket, Key="small")["Body"].read() == b"hello"

    src, back = tmp_path / "src.bin", tmp_path / "back.bin"
    digest = _file(src, 64 * MiB)
    config = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB)
    s3.upload_file(str(src), s3_bucket, "big", Config=config)
    s3.download_file(s3_bucket, "big", str(back), Config=config)
    assert _sha256(back) == digest
    assert s3.head_object(Bucket=s3_bucket, Key="big")["ContentLength"] == 64 * MiB

    counts = fault_proxy.counts()
    assert counts["CreateMultipartUpload"] == 1
    assert counts["UploadPart"] == 8
    assert counts["CompleteMultipartUpload"] == 1
    assert counts["PutObject"] == 1
    assert counts["HeadObject"] >= 2  # download_file's, then the test's
    assert counts["GetObject"] >= 1 + 8  # the small one, then the ranges
    assert "SlowDown" not in counts
    assert all(r.status in (200, 206) for r in fault_proxy.requests())


def test_a_chunked_body_and_keep_alive(moto, s3_bucket, fault_proxy):
    """A chunked upload, then another request on the same connection
    (moto takes unsigned writes)."""
    port = int(fault_proxy.endpoint.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    pieces = [b"a" * 1000, os.urandom(3 * MiB), b"z" * 5]
    conn.request("PUT", f"/{s3_bucket}/chunked", body=iter(pieces), encode_chunked=True)
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    resp.read()
    conn.request("PUT", f"/{s3_bucket}/second", body=b"x" * 10)
    assert conn.getresponse().status == 200
    conn.close()
    s3 = moto.boto3()
    assert s3.get_object(Bucket=s3_bucket, Key="chunked")["Body"].read() == b"".join(pieces)
    assert s3.get_object(Bucket=s3_bucket, Key="second")["Body"].read() == b"x" * 10
    assert [r.headers.get("transfer-encoding") for r in fault_proxy.requests()] == ["chunked", None]


def test_throttled_requests_are_retried_by_boto3(moto, s3_bucket, fault_proxy):
    s3 = moto.boto3(fault_proxy.endpoint, retries={"max_attempts": 5, "mode": "standard"})
    body = os.urandom(2 * MiB)  # large enough that boto3 waits for 100-continue
    fault_proxy.throttle(2)
    s3.put_object(Bucket=s3_bucket, Key="k", Body=body)
    assert fault_proxy.counts() == {"PutObject": 3, "SlowDown": 2}
    assert [r.status for r in fault_proxy.requests()] == [503, 503, 200]

    fault_proxy.throttle(2)  # a small request: answered on a connection kept open
    assert s3.get_object(Bucket=s3_bucket, Key="k")["Body"].read() == body
    assert fault_proxy.counts() == {"PutObject": 3, "GetObject": 3, "SlowDown": 4}

    fault_proxy.throttle(1)
    no_retries = _no_retries(moto, fault_proxy)
    with pytest.raises(ClientError) as e:
        no_retries.head_object(Bucket=s3_bucket, Key="k")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    fault_proxy.throttle(1)
    with pytest.raises(ClientError, match="SlowDown"):
        no_retries.get_object(Bucket=s3_bucket, Key="k")


def test_an_upload_dropped_before_its_completion_leaves_no_object(moto, s3_bucket, fault_proxy):
    """An uploader cut off just before CompleteMultipartUpload (as a
    SIGKILLed server is): no object, the upload left unfinished."""
    s3 = _no_retries(moto, fault_proxy)
    fault_proxy.hold("CompleteMultipartUpload")
    upload_id = s3.create_multipart_upload(Bucket=s3_bucket, Key="x.pt")["UploadId"]
    parts = [{"PartNumber": n, "ETag": s3.upload_part(
        Bucket=s3_bucket, Key="x.pt", UploadId=upload_id, PartNumber=n,
        Body=os.urandom(5 * MiB))["ETag"]} for n in (1, 2)]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        complete = pool.submit(s3.complete_multipart_upload, Bucket=s3_bucket, Key="x.pt",
                               UploadId=upload_id, MultipartUpload={"Parts": parts})
        held = fault_proxy.wait_held(1)
        assert [(r.kind, r.path, r.query) for r in held] == [
            ("CompleteMultipartUpload", f"/{s3_bucket}/x.pt", {"uploadId": upload_id})]
        assert fault_proxy.drop_held() == 1
        with pytest.raises(CUT):
            complete.result(timeout=60)
    fault_proxy.release()
    assert held[0].status is None  # never forwarded, never answered
    assert fault_proxy.counts() == {"CreateMultipartUpload": 1, "UploadPart": 2,
                                    "CompleteMultipartUpload": 1}

    direct = moto.boto3()
    with pytest.raises(ClientError) as e:
        direct.head_object(Bucket=s3_bucket, Key="x.pt")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    uploads = direct.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
    assert [(u["Key"], u["UploadId"]) for u in uploads] == [("x.pt", upload_id)]


def test_boto3_upload_file_cut_off_mid_parts(moto, s3_bucket, fault_proxy, tmp_path):
    """upload_file with its third part held, then the endpoint gone: the
    transfer fails, and its abort with it, so the upload stays unfinished."""
    from boto3.s3.transfer import TransferConfig

    src = tmp_path / "src.bin"
    _file(src, 40 * MiB)
    s3 = _no_retries(moto, fault_proxy)
    fault_proxy.hold(lambda r: r.kind == "UploadPart" and r.query["partNumber"] == "3")
    config = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB,
                            max_concurrency=1)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        upload = pool.submit(s3.upload_file, str(src), s3_bucket, "y.pt", Config=config)
        fault_proxy.wait_held(1, timeout=120)
        assert fault_proxy.counts() == {"CreateMultipartUpload": 1, "UploadPart": 3}
        fault_proxy.refuse()
        with pytest.raises((S3UploadFailedError, *CUT)):
            upload.result(timeout=120)
    fault_proxy.accept()
    fault_proxy.release()
    assert fault_proxy.counts().get("CompleteMultipartUpload", 0) == 0
    direct = moto.boto3()
    uploads = direct.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
    assert [u["Key"] for u in uploads] == ["y.pt"]
    parts = direct.list_parts(Bucket=s3_bucket, Key="y.pt", UploadId=uploads[0]["UploadId"])
    assert [p["PartNumber"] for p in parts.get("Parts", [])] == [1, 2]


def test_a_held_request_goes_on_when_released(moto, s3_bucket, fault_proxy):
    s3 = moto.boto3(fault_proxy.endpoint)
    fault_proxy.hold(lambda r: r.kind == "PutObject" and r.path.endswith("/held"))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        put = pool.submit(s3.put_object, Bucket=s3_bucket, Key="held", Body=b"v")
        fault_proxy.wait_held(1)
        s3.put_object(Bucket=s3_bucket, Key="other", Body=b"o")  # not held
        with pytest.raises(ClientError):
            moto.boto3().head_object(Bucket=s3_bucket, Key="held")
        fault_proxy.release()
        put.result(timeout=60)
    assert moto.boto3().get_object(Bucket=s3_bucket, Key="held")["Body"].read() == b"v"


def test_a_held_request_whose_client_goes_away_is_not_forwarded(moto, s3_bucket, fault_proxy):
    port = int(fault_proxy.endpoint.rsplit(":", 1)[1])
    fault_proxy.hold("PutObject")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("PUT", f"/{s3_bucket}/gone", body=b"x" * 100)
    fault_proxy.wait_held(1)
    conn.close()  # as a SIGKILLed client's kernel does
    until(lambda: not fault_proxy.held(), 60, "the held request to be let go")
    fault_proxy.release()
    with pytest.raises(ClientError):
        moto.boto3().head_object(Bucket=s3_bucket, Key="gone")


def test_a_held_answer_comes_after_its_request_took_effect(moto, s3_bucket, fault_proxy):
    """hold_replies: the request is done upstream while its answer waits;
    released, the client gets it; dropped, the client's connection is reset
    and the request stays done all the same."""
    s3 = _no_retries(moto, fault_proxy)
    fault_proxy.hold_replies("PutObject")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        put = pool.submit(s3.put_object, Bucket=s3_bucket, Key="landed", Body=b"v")
        fault_proxy.wait_held_replies(1)
        assert moto.boto3().get_object(Bucket=s3_bucket, Key="landed")["Body"].read() == b"v"
        assert not put.done()
        fault_proxy.drop_replies()
        with pytest.raises(CUT):
            put.result(timeout=60)
        put = pool.submit(s3.put_object, Bucket=s3_bucket, Key="landed", Body=b"w")
        fault_proxy.wait_held_replies(1)
        fault_proxy.release_replies()
        assert put.result(timeout=60)["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert moto.boto3().get_object(Bucket=s3_bucket, Key="landed")["Body"].read() == b"w"


def test_uploads_created_through_the_proxy_are_listed_with_their_creation_time(moto, s3_bucket, fault_proxy):
    """moto lists every upload as initiated at one fixed time; the proxy
    gives those created through it the time their creation was answered."""
    import datetime
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    s3 = moto.boto3(fault_proxy.endpoint)
    mine = s3.create_multipart_upload(Bucket=s3_bucket, Key="k")["UploadId"]
    direct = moto.boto3().create_multipart_upload(Bucket=s3_bucket, Key="k")["UploadId"]
    after = datetime.datetime.now(datetime.timezone.utc)
    listed = {u["UploadId"]: u["Initiated"] for u in s3.list_multipart_uploads(Bucket=s3_bucket)["Uploads"]}
    assert before <= listed[mine] <= after
    assert listed[direct].year == 2010  # moto's own


def test_refuse_takes_the_endpoint_down_and_accept_brings_it_back(moto, s3_bucket, fault_proxy):
    s3 = _no_retries(moto, fault_proxy)
    s3.put_object(Bucket=s3_bucket, Key="k", Body=b"1")  # a connection now pooled
    fault_proxy.refuse()
    for _ in range(2):  # the pooled connection, then a new one
        with pytest.raises(CUT):
            s3.get_object(Bucket=s3_bucket, Key="k")
    fault_proxy.accept()
    assert s3.get_object(Bucket=s3_bucket, Key="k")["Body"].read() == b"1"
