//! The S3 blob cache against a real S3 server (moto): put, get, multipart, faults.

use crate::{init_crypto, need};
use labforge_builder::cache::{MIN_PART_SIZE, S3Cache, S3CacheConfig};
use labforge_tests::S3Server;
use std::fs;

fn cache_for(server: &S3Server, bucket: &str) -> S3Cache {
    S3Cache::new(S3CacheConfig {
        endpoint: Some(server.endpoint()),
        region: "us-east-1".into(),
        bucket: bucket.into(),
        prefix: "labforge/".into(),
        access_key_id: "labforge-test".into(),
        secret_access_key: "labforge-test-secret".into(),
        part_size: MIN_PART_SIZE,
    })
}

fn patterned(len: usize) -> Vec<u8> {
    labforge_tests::noise(len, 0x9E37_79B9)
}

#[tokio::test]
async fn put_get_and_multipart_round_trip() {
    init_crypto();
    let server = need(S3Server::start().await);
    let cache = cache_for(&server, "labforge-e2e");
    cache.ensure_bucket().await.unwrap();
    let dir = tempfile::tempdir().unwrap();

    assert!(!cache.contains("blobs/sha256/missing").await.unwrap());
    let absent = dir.path().join("absent");
    assert!(
        !cache
            .get_to_file("blobs/sha256/missing", &absent)
            .await
            .unwrap()
    );
    assert!(!absent.exists(), "a miss creates no file");

    let small = dir.path().join("small");
    fs::write(&small, patterned(1024)).unwrap();
    cache.put_file("blobs/sha256/small", &small).await.unwrap();
    assert!(cache.contains("blobs/sha256/small").await.unwrap());
    let small_back = dir.path().join("small.back");
    assert!(
        cache
            .get_to_file("blobs/sha256/small", &small_back)
            .await
            .unwrap()
    );
    assert_eq!(fs::read(&small_back).unwrap(), fs::read(&small).unwrap());

    // Two full parts and a short third one.
    let big = dir.path().join("big");
    let big_bytes = patterned(2 * MIN_PART_SIZE + 12_345);
    fs::write(&big, &big_bytes).unwrap();
    cache.put_file("blobs/sha256/big", &big).await.unwrap();
    let big_back = dir.path().join("big.back");
    assert!(
        cache
            .get_to_file("blobs/sha256/big", &big_back)
            .await
            .unwrap()
    );
    assert!(
        fs::read(&big_back).unwrap() == big_bytes,
        "multipart object differs"
    );
}

#[tokio::test]
async fn s3_down_is_an_error_naming_bucket_and_operation() {
    init_crypto();
    let mut server = need(S3Server::start().await);
    let cache = cache_for(&server, "labforge-down");
    cache.ensure_bucket().await.unwrap();
    server.stop();
    let err = cache
        .contains("blobs/sha256/any")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("labforge-down") && err.contains("head"),
        "{err}"
    );
}

#[tokio::test]
async fn a_missing_bucket_or_server_is_told_in_one_line_with_what_to_do() {
    init_crypto();
    let mut server = need(S3Server::start().await);
    let cache = cache_for(&server, "no-such-bucket");
    let dir = tempfile::tempdir().unwrap();
    let blob = dir.path().join("blob");
    fs::write(&blob, b"layer").unwrap();
    let missing = cache
        .put_file("blobs/sha256/abc", &blob)
        .await
        .unwrap_err()
        .to_string();
    for what in [
        "bucket \"no-such-bucket\"",
        "does not exist; create it",
        "caused by: NoSuchBucket",
    ] {
        assert!(missing.contains(what), "{what:?} missing from: {missing}");
    }

    server.stop();
    let gone =
        labforge_messages::error_chain(&cache.contains("blobs/sha256/abc").await.unwrap_err());
    assert!(
        gone.contains(&format!("{} is unreachable", server.endpoint())),
        "{gone}"
    );
    for message in [&missing, &gone] {
        assert!(
            message.chars().count() <= 300 && !message.contains("{ ") && !message.contains('\n'),
            "{message}"
        );
    }
}
