package dev.idempotency.servlet;

import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;

/** Rule store-less: what is stored of an answer under the route's redact and storeBody options. */
final class Redaction {
    /** What a store-less route adds to the stored headers (stored whatever the replay allow-list says). */
    static final Set<String> STORE_LESS = Set.of("idempotent-replay-redacted", "idempotent-replay-body");

    private Redaction() {}

    /** A JSON Pointer's reference tokens (RFC 6901); IllegalArgumentException for anything else. */
    static List<String> tokens(String pointer) {
        if (pointer == null || !pointer.startsWith("/")) {
            throw new IllegalArgumentException(
                    "idempotency: redact takes JSON Pointers such as \"/card/number\", not " + pointer);
        }
        List<String> out = new ArrayList<>();
        for (String t : pointer.substring(1).split("/", -1)) out.add(t.replace("~1", "/").replace("~0", "~"));
        return out;
    }

    static boolean isJsonType(String contentType) {
        if (contentType == null) return false;
        int semi = contentType.indexOf(';');
        String media = (semi < 0 ? contentType : contentType.substring(0, semi)).trim().toLowerCase(Locale.ROOT);
        return media.equals("application/json") || media.endsWith("+json");
    }

    /**
     * The answer to store: with storeBody false the status and headers only (no body, no Content-Type) and
     * {@code Idempotent-Replay-Body: omitted}; with pointers, a JSON object body without the members they name
     * (re-serialised) and {@code Idempotent-Replay-Redacted} listing the pointers dropped. Else as it is.
     */
    static Answer toStore(Answer a, List<String> redact, boolean storeBody) {
        if (!storeBody) {
            List<String[]> h = new ArrayList<>();
            for (String[] x : a.headers()) if (!x[0].equalsIgnoreCase("Content-Type")) h.add(x);
            h.add(new String[] {"Idempotent-Replay-Body", "omitted"});
            return new Answer(a.status(), h, null);
        }
        if (redact.isEmpty() || !isJsonType(a.header("Content-Type"))) return a;
        Object value;
        try {
            String text = StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT).decode(ByteBuffer.wrap(a.body())).toString();
            value = Json.parse(text);
        } catch (CharacterCodingException | IllegalArgumentException e) {
            return a;
        }
        if (!(value instanceof Map)) return a;
        List<String> dropped = new ArrayList<>();
        for (String pointer : redact) {
            List<String> tokens = tokens(pointer);
            Object parent = value;
            for (String t : tokens.subList(0, tokens.size() - 1)) {
                parent = parent instanceof Map<?, ?> m ? m.get(t) : null;
            }
            if (parent instanceof Map<?, ?> m && m.containsKey(tokens.get(tokens.size() - 1))) {
                m.remove(tokens.get(tokens.size() - 1));
                dropped.add(pointer);
            }
        }
        if (dropped.isEmpty()) return a;
        List<String[]> h = new ArrayList<>(a.headers());
        h.add(new String[] {"Idempotent-Replay-Redacted", String.join(", ", dropped)});
        return new Answer(a.status(), h, Json.write(value).getBytes(StandardCharsets.UTF_8));
    }
}
