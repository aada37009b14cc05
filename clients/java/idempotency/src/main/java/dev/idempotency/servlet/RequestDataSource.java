package dev.idempotency.servlet;

import java.io.PrintWriter;
import java.lang.reflect.InvocationHandler;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Proxy;
import java.sql.Connection;
import java.sql.SQLException;
import java.sql.SQLFeatureNotSupportedException;
import java.util.logging.Logger;
import javax.sql.DataSource;

/**
 * A {@link DataSource} for the application's code: inside a request the filter protects (on the thread that runs
 * its handler) {@link #getConnection()} is the request's connection, in the transaction that holds the claim;
 * anywhere else, a connection of the wrapped DataSource. The request's connection as handed out ignores
 * {@code close()} and refuses {@code commit()}, {@code rollback()} and {@code setAutoCommit()}: the filter ends the
 * transaction.
 */
final class RequestDataSource implements DataSource {
    static final ThreadLocal<Connection> CURRENT = new ThreadLocal<>();
    private final DataSource delegate;

    RequestDataSource(DataSource delegate) {
        this.delegate = delegate;
    }

    /** {@code c} as the handler gets it (see the class comment). */
    static Connection handedOut(Connection c) {
        InvocationHandler h = (proxy, method, args) -> {
            switch (method.getName()) {
                case "close":
                    return null;
                case "isClosed":
                    return c.isClosed();
                case "commit":
                case "setAutoCommit":
                    throw new SQLException("the request's transaction is the idempotency filter's: it commits it",
                            "25000");
                case "rollback":
                    if (args == null || args.length == 0) {
                        throw new SQLException("the request's transaction is the idempotency filter's: throw, or "
                                + "answer 5xx, to roll it back", "25000");
                    }
                    break;
                case "unwrap":
                    if (((Class<?>) args[0]).isInstance(proxy)) return proxy;
                    break;
                default:
                    break;
            }
            try {
                return method.invoke(c, args);
            } catch (InvocationTargetException e) {
                throw e.getCause();
            }
        };
        return (Connection) Proxy.newProxyInstance(Connection.class.getClassLoader(), new Class<?>[] {Connection.class},
                h);
    }

    @Override
    public Connection getConnection() throws SQLException {
        Connection c = CURRENT.get();
        return c != null ? c : delegate.getConnection();
    }

    @Override
    public Connection getConnection(String user, String password) throws SQLException {
        Connection c = CURRENT.get();
        return c != null ? c : delegate.getConnection(user, password);
    }

    @Override
    public PrintWriter getLogWriter() throws SQLException {
        return delegate.getLogWriter();
    }

    @Override
    public void setLogWriter(PrintWriter out) throws SQLException {
        delegate.setLogWriter(out);
    }

    @Override
    public void setLoginTimeout(int seconds) throws SQLException {
        delegate.setLoginTimeout(seconds);
    }

    @Override
    public int getLoginTimeout() throws SQLException {
        return delegate.getLoginTimeout();
    }

    @Override
    public Logger getParentLogger() throws SQLFeatureNotSupportedException {
        return delegate.getParentLogger();
    }

    @Override
    public <T> T unwrap(Class<T> iface) throws SQLException {
        return iface.isInstance(this) ? iface.cast(this) : delegate.unwrap(iface);
    }

    @Override
    public boolean isWrapperFor(Class<?> iface) throws SQLException {
        return iface.isInstance(this) || delegate.isWrapperFor(iface);
    }
}
