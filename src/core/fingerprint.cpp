#include "fingerprint.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#ifdef PG_VERSION_NUM
#error "src/core includes no PostgreSQL header: the PostgreSQL layer reaches it only through idem_core.h"
#endif

namespace idem::core {

namespace {

char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool is_ows(char c) { return c == ' ' || c == '\t'; }

std::string_view trim_ows(std::string_view s) {
    while (!s.empty() && is_ows(s.front()))
        s.remove_prefix(1);
    while (!s.empty() && is_ows(s.back()))
        s.remove_suffix(1);
    return s;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// The JSON lexer's "alphanumeric" of PostgreSQL: a token that runs on into one of these is not JSON.
bool is_json_alnum(char c) {
    const unsigned char b = static_cast<unsigned char>(c);
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_' || b >= 0x80;
}

void append_utf8(std::uint32_t cp, std::string& out) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
        out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
}

// Length of the well-formed UTF-8 sequence at s[i] (RFC 3629: no overlong forms, no surrogates, nothing past
// U+10FFFF; the rules of PostgreSQL's pg_utf8_islegal), or 0.
std::size_t utf8_sequence(std::string_view s, std::size_t i) {
    const auto at = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char b = at(i);
    std::size_t n;
    unsigned char lo = 0x80, hi = 0xbf;
    if (b < 0x80)
        return 1;
    if (b >= 0xc2 && b <= 0xdf)
        n = 2;
    else if (b >= 0xe0 && b <= 0xef) {
        n = 3;
        if (b == 0xe0)
            lo = 0xa0;
        else if (b == 0xed)
            hi = 0x9f;
    } else if (b >= 0xf0 && b <= 0xf4) {
        n = 4;
        if (b == 0xf0)
            lo = 0x90;
        else if (b == 0xf4)
            hi = 0x8f;
    } else
        return 0;
    if (i + n > s.size())
        return 0;
    if (at(i + 1) < lo || at(i + 1) > hi)
        return 0;
    for (std::size_t k = 2; k < n; ++k)
        if ((at(i + k) & 0xc0) != 0x80)
            return 0;
    return n;
}

class Canonicaliser {
public:
    explicit Canonicaliser(std::string_view in) : in_(in) {}

    bool document(std::string& out) {
        if (members_.capacity() > 4096)
            std::vector<Member>().swap(members_);  // a large object's stack is not kept
        members_.clear();
        keys_.clear();
        skip_ws();
        if (!value(out, 0))
            return false;
        skip_ws();
        return pos_ == in_.size();
    }

private:
    std::string_view in_;
    std::size_t pos_ = 0;

    bool at_end() const { return pos_ >= in_.size(); }
    char peek() const { return in_[pos_]; }

    void skip_ws() {
        while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r'))
            ++pos_;
    }

    bool value(std::string& out, int depth) {
        if (at_end())
            return false;
        switch (peek()) {
            case '{': return object(out, depth + 1);
            case '[': return array(out, depth + 1);
            case '"': {
                std::string_view raw;
                if (plain_string(raw)) {
                    // Nothing to unescape and nothing escape_json would escape: the bytes as they came.
                    out.push_back('"');
                    out.append(raw);
                    out.push_back('"');
                    return true;
                }
                std::string decoded;
                if (!string(decoded))
                    return false;
                append_json_string(decoded, out);
                return true;
            }
            case 't': return literal("true", out);
            case 'f': return literal("false", out);
            case 'n': return literal("null", out);
            default: return number(out);
        }
    }

    bool literal(std::string_view word, std::string& out) {
        std::size_t end = pos_;
        while (end < in_.size() && is_json_alnum(in_[end]))
            ++end;
        if (in_.substr(pos_, end - pos_) != word)
            return false;
        pos_ = end;
        out.append(word);
        return true;
    }

    // A string token without escapes, control characters or bytes that are not UTF-8: its content, and the
    // position after it. False (nothing consumed) for any other, which string() then reads.
    bool plain_string(std::string_view& content) {
        std::size_t i = pos_ + 1;
        while (i < in_.size()) {
            const unsigned char b = static_cast<unsigned char>(in_[i]);
            if (b == '"') {
                content = in_.substr(pos_ + 1, i - pos_ - 1);
                pos_ = i + 1;
                return true;
            }
            if (b == '\\' || b < 0x20)
                return false;
            if (b < 0x80) {
                ++i;
                continue;
            }
            const std::size_t n = utf8_sequence(in_, i);
            if (n == 0)
                return false;
            i += n;
        }
        return false;
    }

    // A string token's value, unescaped, into decoded.
    bool string(std::string& decoded) {
        ++pos_;  // the opening quote
        for (;;) {
            if (at_end())
                return false;
            const char c = peek();
            const unsigned char b = static_cast<unsigned char>(c);
            if (c == '"') {
                ++pos_;
                return true;
            }
            if (b < 0x20)
                return false;
            if (c != '\\') {
                const std::size_t n = utf8_sequence(in_, pos_);
                if (n == 0)
                    return false;
                decoded.append(in_.substr(pos_, n));
                pos_ += n;
                continue;
            }
            ++pos_;
            if (at_end())
                return false;
            const char e = peek();
            ++pos_;
            switch (e) {
                case '"': decoded.push_back('"'); break;
                case '\\': decoded.push_back('\\'); break;
                case '/': decoded.push_back('/'); break;
                case 'b': decoded.push_back('\b'); break;
                case 'f': decoded.push_back('\f'); break;
                case 'n': decoded.push_back('\n'); break;
                case 'r': decoded.push_back('\r'); break;
                case 't': decoded.push_back('\t'); break;
                case 'u': {
                    std::uint32_t cp;
                    if (!hex4(cp))
                        return false;
                    if (cp >= 0xd800 && cp <= 0xdbff) {
                        std::uint32_t low;
                        if (in_.substr(pos_, 2) != "\\u")
                            return false;
                        pos_ += 2;
                        if (!hex4(low) || low < 0xdc00 || low > 0xdfff)
                            return false;
                        cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
                    } else if (cp >= 0xdc00 && cp <= 0xdfff) {
                        return false;
                    } else if (cp == 0) {
                        return false;  // jsonb refuses \u0000: PostgreSQL reports it
                    }
                    append_utf8(cp, decoded);
                    break;
                }
                default: return false;
            }
        }
    }

    bool hex4(std::uint32_t& cp) {
        if (pos_ + 4 > in_.size())
            return false;
        cp = 0;
        for (int i = 0; i < 4; ++i) {
            const char c = in_[pos_ + i];
            std::uint32_t d;
            if (is_digit(c))
                d = static_cast<std::uint32_t>(c - '0');
            else if (c >= 'a' && c <= 'f')
                d = static_cast<std::uint32_t>(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F')
                d = static_cast<std::uint32_t>(c - 'A' + 10);
            else
                return false;
            cp = cp << 4 | d;
        }
        pos_ += 4;
        return true;
    }

    // A JSON number as numeric_in reads it and numeric_out prints it: the digits shifted by the exponent, the
    // scale (digits after the point) max(0, fraction digits - exponent), no sign on zero.
    bool number(std::string& out) {
        const std::size_t start = pos_;
        bool negative = false;
        if (!at_end() && peek() == '-') {
            negative = true;
            ++pos_;
        }
        std::size_t int_begin = pos_;
        if (at_end())
            return false;
        if (peek() == '0')
            ++pos_;
        else if (peek() >= '1' && peek() <= '9')
            while (!at_end() && is_digit(peek()))
                ++pos_;
        else
            return false;
        const std::string_view int_digits = in_.substr(int_begin, pos_ - int_begin);
        std::string_view frac_digits;
        if (!at_end() && peek() == '.') {
            ++pos_;
            const std::size_t b = pos_;
            while (!at_end() && is_digit(peek()))
                ++pos_;
            if (pos_ == b)
                return false;
            frac_digits = in_.substr(b, pos_ - b);
        }
        long exponent = 0;
        const bool has_exponent = !at_end() && (peek() == 'e' || peek() == 'E');
        if (has_exponent) {
            ++pos_;
            bool exp_negative = false;
            if (!at_end() && (peek() == '+' || peek() == '-')) {
                exp_negative = peek() == '-';
                ++pos_;
            }
            const std::size_t b = pos_;
            while (!at_end() && is_digit(peek())) {
                if (pos_ - b < 8)
                    exponent = exponent * 10 + (peek() - '0');
                ++pos_;
            }
            if (pos_ == b)
                return false;
            if (pos_ - b >= 8 || exponent > static_cast<long>(max_number_digits))
                return false;  // beyond the exact range: PostgreSQL decides (and may refuse)
            if (exp_negative)
                exponent = -exponent;
        }
        if (!at_end() && is_json_alnum(peek()))
            return false;
        if (pos_ - start > max_number_digits)
            return false;
        if (!has_exponent) {
            // Without an exponent numeric prints what JSON allows as it came, but for the sign of a zero.
            const std::string_view text = in_.substr(start, pos_ - start);
            if (negative && text.find_first_not_of("-0.") == std::string_view::npos)
                out.append(text.substr(1));
            else
                out.append(text);
            return true;
        }

        // All significant digits, and where the point falls in them after the exponent.
        std::string digits(int_digits);
        digits.append(frac_digits);
        long point = static_cast<long>(int_digits.size()) + exponent;  // digits before the point
        long scale = static_cast<long>(frac_digits.size()) - exponent;
        if (scale < 0)
            scale = 0;
        // Integer part: digits[0, point), zero-padded when point runs past the digits.
        std::string integer;
        for (long i = 0; i < point; ++i)
            integer.push_back(i < static_cast<long>(digits.size()) ? digits[static_cast<std::size_t>(i)] : '0');
        std::size_t nz = 0;
        while (nz < integer.size() && integer[nz] == '0')
            ++nz;
        integer.erase(0, nz);
        if (integer.empty())
            integer = "0";
        std::string fraction;
        for (long i = 0; i < scale; ++i) {
            const long k = point + i;
            fraction.push_back(k >= 0 && k < static_cast<long>(digits.size()) ? digits[static_cast<std::size_t>(k)]
                                                                               : '0');
        }
        const bool zero = digits.find_first_not_of('0') == std::string::npos;
        // The printed number must itself be within what this reader takes (a fixed point: read again, it prints
        // itself); a longer one (digits shifted by a large exponent) is left to PostgreSQL, as its input would be.
        if ((negative && !zero ? 1 : 0) + integer.size() + (fraction.empty() ? 0 : 1 + fraction.size()) >
            max_number_digits)
            return false;
        if (negative && !zero)
            out.push_back('-');
        out.append(integer);
        if (!fraction.empty()) {
            out.push_back('.');
            out.append(fraction);
        }
        return true;
    }

    bool array(std::string& out, int depth) {
        if (depth > max_depth)
            return false;
        ++pos_;
        out.push_back('[');
        skip_ws();
        if (!at_end() && peek() == ']') {
            ++pos_;
            out.push_back(']');
            return true;
        }
        for (bool first = true;; first = false) {
            if (!first)
                out.append(", ");
            skip_ws();
            if (!value(out, depth))
                return false;
            skip_ws();
            if (at_end())
                return false;
            if (peek() == ']') {
                ++pos_;
                out.push_back(']');
                return true;
            }
            if (peek() != ',')
                return false;
            ++pos_;
        }
    }

    struct Member {
        std::string_view key;     // into the input, or into keys_ when it had escapes
        std::size_t begin;        // the member's text ("key": value) in out
        std::size_t end;
        std::size_t order;
    };
    // A stack (each object uses the part from its start) and the unescaped keys of keys that had escapes (a
    // deque: views into it stay valid), both per thread and kept, so a request allocates neither.
    static std::vector<Member>& members_stack() {
        thread_local std::vector<Member> members;
        return members;
    }
    static std::deque<std::string>& unescaped_keys() {
        thread_local std::deque<std::string> keys;
        return keys;
    }
    // The sorted copy of an object's members, per thread and kept: an object's copy is finished and taken back
    // into out before any other object is sorted.
    static std::string& sorted_members() {
        thread_local std::string sorted;
        return sorted;
    }
    static constexpr std::size_t small_object_members = 16;
    static constexpr std::size_t kept_sorted_bytes = 64 * 1024;
    std::vector<Member>& members_ = members_stack();
    std::deque<std::string>& keys_ = unescaped_keys();

    static bool key_less(const Member& a, const Member& b) {
        if (a.key.size() != b.key.size())
            return a.key.size() < b.key.size();
        const int c = a.key.compare(b.key);
        if (c != 0)
            return c < 0;
        return a.order > b.order;  // the later duplicate first: it is the one kept
    }

    // jsonb's object: keys ordered by length, then bytes; of duplicate keys the last one stays. Members are
    // written in place as they come; only an object whose keys are not already in that order, or repeat, is
    // rewritten.
    bool object(std::string& out, int depth) {
        if (depth > max_depth)
            return false;
        ++pos_;
        skip_ws();
        if (!at_end() && peek() == '}') {
            ++pos_;
            out.append("{}");
            return true;
        }
        const std::size_t first = members_.size();
        const std::size_t start = out.size();
        bool ordered = true;
        out.push_back('{');
        for (;;) {
            skip_ws();
            if (at_end() || peek() != '"')
                return false;
            if (members_.size() > first)
                out.append(", ");
            Member m;
            m.begin = out.size();
            m.order = members_.size() - first;
            std::string_view raw;
            if (plain_string(raw)) {
                m.key = raw;
                out.push_back('"');
                out.append(raw);
                out.push_back('"');
            } else {
                std::string decoded;
                if (!string(decoded))
                    return false;
                append_json_string(decoded, out);
                keys_.push_back(std::move(decoded));
                m.key = keys_.back();
            }
            skip_ws();
            if (at_end() || peek() != ':')
                return false;
            ++pos_;
            skip_ws();
            out.append(": ");
            if (!value(out, depth))
                return false;
            m.end = out.size();
            if (members_.size() > first && !key_less(members_.back(), m))
                ordered = false;
            members_.push_back(m);
            skip_ws();
            if (at_end())
                return false;
            if (peek() == '}') {
                ++pos_;
                break;
            }
            if (peek() != ',')
                return false;
            ++pos_;
        }
        if (!ordered) {
            // key_less orders every pair (the members' order breaks ties): an insertion sort, which allocates
            // nothing, for the few members of a usual object.
            const auto begin = members_.begin() + static_cast<std::ptrdiff_t>(first);
            if (members_.size() - first <= small_object_members) {
                for (auto i = begin + 1; i < members_.end(); ++i)
                    for (auto j = i; j > begin && key_less(*j, *(j - 1)); --j)
                        std::iter_swap(j, j - 1);
            } else {
                std::stable_sort(begin, members_.end(), key_less);
            }
            std::string& sorted = sorted_members();
            sorted.clear();
            sorted.push_back('{');
            const Member* previous = nullptr;
            for (std::size_t i = first; i < members_.size(); ++i) {
                const Member& m = members_[i];
                if (previous != nullptr && previous->key == m.key)
                    continue;
                if (previous != nullptr)
                    sorted.append(", ");
                sorted.append(out, m.begin, m.end - m.begin);
                previous = &m;
            }
            out.resize(start);
            out.append(sorted);
            if (sorted.capacity() > kept_sorted_bytes)
                std::string().swap(sorted);  // a large object's copy is not kept
        }
        out.push_back('}');
        members_.resize(first);
        return true;
    }
};

}  // namespace

namespace {

// Whether text is word in ASCII case-insensitively; word is lower case.
bool equals_ascii_lower(std::string_view text, std::string_view word) {
    if (text.size() != word.size())
        return false;
    for (std::size_t i = 0; i < text.size(); ++i)
        if (ascii_lower(text[i]) != word[i])
            return false;
    return true;
}

}  // namespace

bool is_json_media_type(std::string_view content_type) {
    std::string_view media = content_type.substr(0, content_type.find(';'));
    media = trim_ows(media);
    if (equals_ascii_lower(media, "application/json"))
        return true;
    const std::size_t slash = media.find('/');
    return slash != std::string_view::npos && slash > 0 && media.size() > slash + 1 + 5 &&
           equals_ascii_lower(media.substr(media.size() - 5), "+json");
}

std::string normalise_content_type(std::string_view content_type) {
    const std::string_view trimmed = trim_ows(content_type);
    const std::size_t semicolon = trimmed.find(';');
    std::string out;
    for (char c : trimmed.substr(0, semicolon))
        out.push_back(ascii_lower(c));
    if (semicolon != std::string_view::npos)
        out.append(trimmed.substr(semicolon));
    return out;
}

bool canonical_json(std::string_view json, std::string& out) {
    return Canonicaliser(json).document(out);
}

void append_json_string(std::string_view text, std::string& out) {
    static const char hex[] = "0123456789abcdef";
    out.push_back('"');
    for (char c : text) {
        switch (c) {
            case '\b': out.append("\\b"); break;
            case '\f': out.append("\\f"); break;
            case '\n': out.append("\\n"); break;
            case '\r': out.append("\\r"); break;
            case '\t': out.append("\\t"); break;
            case '"': out.append("\\\""); break;
            case '\\': out.append("\\\\"); break;
            default:
                if (static_cast<unsigned char>(c) < 0x20) {
                    out.append("\\u00");
                    out.push_back(hex[(static_cast<unsigned char>(c) >> 4) & 0xf]);
                    out.push_back(hex[static_cast<unsigned char>(c) & 0xf]);
                } else {
                    out.push_back(c);
                }
        }
    }
    out.push_back('"');
}

void append_json_form(std::string_view method, std::string_view path, std::string_view query,
                      std::string_view canonical_body, std::string& out) {
    out.append(json_form_head);
    out.append(canonical_body);
    append_json_form_tail(method, path, query, out);
}

void append_json_form_tail(std::string_view method, std::string_view path, std::string_view query,
                           std::string& out) {
    // jsonb orders keys by length, then bytes: body, path, query, method.
    out.append(", \"path\": ");
    append_json_string(path, out);
    if (!query.empty()) {
        out.append(", \"query\": ");
        append_json_string(query, out);
    }
    out.append(", \"method\": ");
    append_json_string(method, out);
    out.push_back('}');
}

}  // namespace idem::core
