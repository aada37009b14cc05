// The request fingerprint of 1.3 (issue 30): jsonb's canonical text reproduced byte for byte, the JSON and
// bytes forms, and what the core leaves to PostgreSQL. The SQL property test (sql/fingerprint.sql) checks the
// same against jsonb itself over a generated corpus.
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "fingerprint.hpp"
#include "test_support.hpp"

namespace {

using idem::core::canonical_json;

std::string canon(const std::string& json) {
    std::string out;
    if (!canonical_json(json, out))
        return "<left to PostgreSQL>";
    return out;
}

// Views of string literals: the request points into them.
IdemRequest request(std::string_view method, std::string_view path, std::string_view query,
                    const char* content_type, std::string_view body) {
    IdemRequest r{};
    r.method = method.data();
    r.method_len = method.size();
    r.path = path.data();
    r.path_len = path.size();
    r.query = query.data();
    r.query_len = query.size();
    r.content_type = content_type;
    r.content_type_len = content_type ? std::string(content_type).size() : 0;
    r.body = body.data();
    r.body_len = body.size();
    return r;
}

Digest fingerprint(const IdemRequest& r) {
    Digest d{};
    EXPECT_EQ(idem_core_fingerprint(&r, d.data()), IDEM_OK);
    return d;
}

}  // namespace

TEST(CanonicalJson, NumbersAsNumericPrintsThem) {
    EXPECT_EQ(canon("1.0"), "1.0");
    EXPECT_EQ(canon("1e2"), "100");
    EXPECT_EQ(canon("1E+2"), "100");
    EXPECT_EQ(canon("1.50e1"), "15.0");
    EXPECT_EQ(canon("1e-2"), "0.01");
    EXPECT_EQ(canon("-0"), "0");
    EXPECT_EQ(canon("-0.0"), "0.0");
    EXPECT_EQ(canon("-0.0e-5"), "0.000000");
    EXPECT_EQ(canon("0e10"), "0");
    EXPECT_EQ(canon("-12.340"), "-12.340");
    EXPECT_EQ(canon("123e-5"), "0.00123");
    EXPECT_EQ(canon("12345678901234567890123"), "12345678901234567890123");
}

TEST(CanonicalJson, StringsAsEscapeJsonWritesThem) {
    EXPECT_EQ(canon(R"("a\/b")"), R"("a/b")");
    EXPECT_EQ(canon(R"("\u00e9\u00E9é")"), "\"\xc3\xa9\xc3\xa9\xc3\xa9\"");
    EXPECT_EQ(canon(R"("\ud83d\ude00")"), "\"\xf0\x9f\x98\x80\"");
    EXPECT_EQ(canon(R"("\u0008\u000c\u001f\u007f")"), "\"\\b\\f\\u001f\x7f\"");
    EXPECT_EQ(canon(R"("q\"b\\")"), R"("q\"b\\")");
}

TEST(CanonicalJson, ObjectsAsJsonbOrdersThem) {
    // Shorter keys first, then bytes; of duplicate keys the last stays.
    EXPECT_EQ(canon(R"({"bb": 1, "a": 2, "ab": 3})"), R"({"a": 2, "ab": 3, "bb": 1})");
    EXPECT_EQ(canon(R"({"a": 1, "a": {"x": 1, "x": 2}, "b": 0})"), R"({"a": {"x": 2}, "b": 0})");
    EXPECT_EQ(canon(" {\n\t\"a\" :[ 1 ,2,{} ,[]] }\r\n"), R"({"a": [1, 2, {}, []]})");
    EXPECT_EQ(canon("{}"), "{}");
    EXPECT_EQ(canon("[]"), "[]");
    EXPECT_EQ(canon(" true"), "true");
}

TEST(CanonicalJson, LeavesToPostgreSqlWhatItDoesNotReproduce) {
    const std::string left = "<left to PostgreSQL>";
    for (const char* bad : {"", " ", "01", "1.", ".5", "-", "1e", "+1", "tru", "truex", "nul", "[1,]", "{\"a\"}",
                            "{\"a\":1,}", "\"\\u0000\"", "\"\\ud800\"", "\"\\udc00\"", "\"\\x\"", "\"a\tb\"",
                            "\"\xff\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "1 2", "[1] x", "1e1001",
                            "'a'", "NaN", "Infinity"})
        EXPECT_EQ(canon(bad), left) << bad;
    std::string deep;
    for (int i = 0; i < idem::core::max_depth + 1; ++i)
        deep += "[";
    for (int i = 0; i < idem::core::max_depth + 1; ++i)
        deep += "]";
    EXPECT_EQ(canon(deep), left);
    EXPECT_NE(canon(deep.substr(1, deep.size() - 2)), left) << "one level less is canonicalised";
}

TEST(Fingerprint, JsonFormIsTheTextOfJsonbBuildObject) {
    const IdemRequest r = request("POST", "/payments", "", "application/json", R"({ "b":1, "a" : "é" })");
    EXPECT_EQ(fingerprint(r), sha256_one_shot(R"({"body": {"a": "é", "b": 1}, "path": "/payments", "method": "POST"})"));
    const IdemRequest q = request("POST", "/p\"", "?ref=1", nullptr, "[1e2]");
    EXPECT_EQ(fingerprint(q), sha256_one_shot(R"({"body": [100], "path": "/p\"", "query": "ref=1", "method": "POST"})"));
}

TEST(Fingerprint, FormsByContentType) {
    for (const char* json : {"application/json", "APPLICATION/JSON; charset=utf-8", " application/problem+json ",
                             "application/vnd.api+json"}) {
        const IdemRequest r = request("POST", "/p", "", json, "{}");
        EXPECT_TRUE(idem_core_fingerprint_is_json(&r)) << json;
    }
    for (const char* other : {"text/plain", "application/jsonx", "+json", "application/x-www-form-urlencoded", ""}) {
        const IdemRequest r = request("POST", "/p", "", other, "{}");
        EXPECT_FALSE(idem_core_fingerprint_is_json(&r)) << other;
    }
    const IdemRequest body_only = request("POST", "/p", "", nullptr, "{}");
    const IdemRequest neither = request("POST", "/p", "", nullptr, "");
    EXPECT_TRUE(idem_core_fingerprint_is_json(&body_only));
    EXPECT_FALSE(idem_core_fingerprint_is_json(&neither));
}

TEST(Fingerprint, BytesFormFramesEveryPart) {
    const IdemRequest r = request("POST", "/p", "?q=1", "Text/Plain; a=B", "hi");
    std::string preimage = "idempotency fingerprint 1.3 bytes\n";
    for (const std::string part : {"POST", "/p", "q=1", "text/plain; a=B", "hi"}) {
        for (int i = 7; i >= 0; --i)
            preimage.push_back(static_cast<char>((part.size() >> (8 * i)) & 0xff));
        preimage += part;
    }
    EXPECT_EQ(fingerprint(r), sha256_one_shot(preimage));
    EXPECT_NE(fingerprint(request("POST", "/ab", "", "text/plain", "c")),
              fingerprint(request("POST", "/a", "", "text/plain", "bc")));
}

TEST(Fingerprint, NotJsonIsLeftToPostgreSql) {
    const IdemRequest r = request("POST", "/p", "", "application/json", "{nope}");
    Digest d{};
    EXPECT_EQ(idem_core_fingerprint(&r, d.data()), IDEM_ERR_NOT_CANONICAL);
    EXPECT_EQ(idem_core_fingerprint_json_body(&r, "{}", 2, d.data()), IDEM_OK);
    EXPECT_EQ(d, sha256_one_shot(R"({"body": {}, "path": "/p", "method": "POST"})"));
}
